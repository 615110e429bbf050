"""Session 7 (issue 14): the span exporter child fills each OTLP Span message in place instead of
building it from keyword dicts; the request bytes and the bad-record counts stay those of the
keyword construction (the reference below is the encoder as it was), for well-formed and
malformed records alike."""
from __future__ import annotations

import random
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.sdk.resources import Resource

from audit.otlp_trace_request import (
    _CODES,
    _FLAGS_LOCAL,
    _FLAGS_REMOTE,
    _KINDS,
    _STATUS_ERROR,
    FrameError,
    OtlpRequestEncoder,
    pb_attributes,
)


def _reference_encode(resource: Resource, records: list[Any]) -> tuple[bytes, int]:
    """OtlpRequestEncoder.encode before session 7 (verbatim but for names)."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.CopyFrom(PbResource(attributes=pb_attributes(resource.attributes)))
    rs.resource.SetInParent()
    rs.schema_url = resource.schema_url
    scopes: dict[Any, Any] = {}
    bad = good = 0
    for f in records:
        try:
            (name, t_hi, t_lo, span_id, _flags, tstate, parent_id, parent_remote, kind, start, end, attrs,
             code, desc, links, events, s_name, s_version, s_schema, d_attrs, d_events, d_links) = f
            key = (s_name, s_version, s_schema or "") if s_name is not None else None
            spans = scopes.get(key)
            if spans is None:
                ss = rs.scope_spans.add()
                ss.scope.SetInParent()
                if key is not None:
                    ss.scope.name = s_name
                    if s_version is not None:
                        ss.scope.version = s_version
                    ss.schema_url = key[2]
                spans = scopes[key] = ss.spans
            kw = dict(
                trace_id=((t_hi << 64) | t_lo).to_bytes(16, "big"), span_id=span_id.to_bytes(8, "big"),
                trace_state=tstate,
                parent_span_id=parent_id.to_bytes(8, "big") if parent_id is not None else None,
                name=name, kind=_KINDS[kind].value + 1, start_time_unix_nano=start, end_time_unix_nano=end,
                attributes=pb_attributes(attrs),
                events=[{"name": en, "time_unix_nano": ets, "attributes": pb_attributes(ea)}
                        for en, ets, ea in events] if events else None,
                links=[{"trace_id": ((lh << 64) | ll).to_bytes(16, "big"), "span_id": lsid.to_bytes(8, "big"),
                        "attributes": pb_attributes(la), "flags": _FLAGS_REMOTE if lrem else _FLAGS_LOCAL}
                       for lh, ll, lsid, _lf, lrem, la in links] if links else None,
                status={"code": _CODES[code].value,
                        "message": desc if code == _STATUS_ERROR and isinstance(desc, str) else None},
                dropped_attributes_count=d_attrs, dropped_events_count=d_events, dropped_links_count=d_links,
                flags=_FLAGS_REMOTE if parent_remote and parent_id is not None else _FLAGS_LOCAL,
            )
        except (FrameError, KeyError, TypeError, ValueError, AttributeError, OverflowError):
            bad += 1
            continue
        n = len(spans)
        try:
            spans.add(**kw)
            good += 1
        except (TypeError, ValueError):
            if len(spans) > n:
                del spans[n:]
            bad += 1
    if not good:
        return b"", bad
    for i in range(len(rs.scope_spans) - 1, -1, -1):
        if not rs.scope_spans[i].spans:
            del rs.scope_spans[i]
    return req.SerializeToString(), bad


_ATTR_VALUES: list[Any] = ["POST", "", "ü", 0, 1, -5, 2**63 - 1, 2**64, 1.5, float("inf"), True, False, None,
                           [1, 2], ["a", None], [True], {"b": "00ff"}, {"b": "zz"}, {"x": 1}, object()]


def _attrs(rng: random.Random) -> Any:
    roll = rng.random()
    if roll < 0.3:
        return None
    if roll < 0.35:
        return "not a mapping"
    return {f"k{i}": rng.choice(_ATTR_VALUES[:-3] if rng.random() < 0.9 else _ATTR_VALUES)
            for i in range(rng.randrange(0, 12))}


def _record(rng: random.Random) -> list[Any]:
    def maybe(good: Any, *bad: Any) -> Any:
        return good if rng.random() < 0.93 else rng.choice(bad)

    parent = rng.choice([None, rng.getrandbits(64)])
    return [
        maybe(rng.choice(["POST /v1/completions", "route", ""]), None, 5),
        maybe(rng.getrandbits(64), None, -1, "x"), maybe(rng.getrandbits(64), None, 2**65),
        maybe(rng.getrandbits(64), None, -3, 1.5), 1, maybe(rng.choice([None, "", "a=b"]), 7),
        maybe(parent, -1, "p"), rng.choice([True, False]), maybe(rng.choice([0, 1, 2, 3, 4]), 9, None),
        maybe(rng.getrandbits(60), None, -1, "t"), maybe(rng.getrandbits(60), None, 2**64),
        _attrs(rng), maybe(rng.choice([0, 1, 2]), 5, None), rng.choice([None, "boom", 3]),
        maybe(rng.choice([None, [], [(rng.getrandbits(64), rng.getrandbits(64), rng.getrandbits(64), 1,
                                      rng.choice([True, False]), _attrs(rng))]]), [(1, 2)]),
        maybe(rng.choice([None, [], [("ev", rng.getrandbits(60), _attrs(rng))]]), [("ev",)]),
        rng.choice(["prefixgate", None, "other"]), rng.choice([None, "1.0"]), rng.choice([None, "", "https://x"]),
        maybe(rng.choice([0, 3]), None, -1, "n"), maybe(0, None, -2), maybe(rng.choice([0, 1]), None, "z"),
    ]


@pytest.mark.parametrize("seed", range(40))
def test_in_place_encoding_equals_the_keyword_construction(seed: int) -> None:
    rng = random.Random(seed)
    resource = Resource({"service.name": "prefixgate", "n": seed})
    records = [_record(rng) for _ in range(rng.randrange(1, 60))]
    if seed % 5 == 0:
        records.append("not a record")
    assert OtlpRequestEncoder(resource).encode(records) == _reference_encode(resource, records)


def test_gateway_shaped_batch_equals_the_keyword_construction() -> None:
    rng = random.Random(99)
    resource = Resource({"service.name": "prefixgate"})
    records = []
    for i in range(200):
        hi, lo, psid = rng.getrandbits(64), rng.getrandbits(64), rng.getrandbits(64)
        t = 1_700_000_000_000_000_000 + i
        for k, child in enumerate(("authenticate", "parse", "policy", "route", "upstream")):
            records.append([child, hi, lo, rng.getrandbits(64), 1, None, psid, False, 3 if child == "upstream" else 0,
                            t + k, t + k + 9, None, 0, None, None, None, "prefixgate", None, None, 0, 0, 0])
        records.append(["POST /v1/completions", hi, lo, psid, 1, None, None, False, 1, t, t + 99,
                        {"http.route": "/v1/completions", "http.response.status_code": 200, "x.f": 0.5,
                         "x.b": True}, 2 if i % 7 == 0 else 0, None,
                        [[rng.getrandbits(64), rng.getrandbits(64), rng.getrandbits(64), 1, True,
                          {"prefixgate.link": "client_traceparent"}]] if i % 3 == 0 else None,
                        None, "prefixgate", None, None, 0, 0, 0])
    got = OtlpRequestEncoder(resource).encode(records)
    assert got == _reference_encode(resource, records)
    assert got[1] == 0 and got[0]
