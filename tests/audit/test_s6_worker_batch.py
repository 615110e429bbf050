"""Session 6 (issue 14): the audit worker's per-event CPU cuts keep every output byte-identical.

* :func:`audit.chain.encode_record` (one body encoding per JSONL record) against
  ``canonical_json(make_record(...))``;
* :meth:`AuditEvent.to_dict`'s inlined field loop against :func:`audit.event.json_field`;
* the scrubber's cache of scanned strings still refuses a secret seen after clean strings.
"""
from __future__ import annotations

import pytest

from audit import scrub
from audit.chain import GENESIS, canonical_json, encode_record, make_record
from audit.event import AuditEvent, Kind, Outcome, _EVENT_FIELDS, json_field
from bench.audit_worker_cpu import make_events


def _events() -> list[AuditEvent]:
    evs = make_events(300)
    evs.append(AuditEvent(kind=Kind.SUMMARY, outcome=Outcome.ALLOWED, tenant="t-ü✓", summary={"n": 3, "x": 1e-05}))
    evs.append(AuditEvent(kind=Kind.ALERT, outcome=Outcome.CLEARED, alert={"alert_kind": "k", "v": 0.1}))
    return evs


def test_encode_record_matches_make_record_bytes() -> None:
    prev = GENESIS
    for seq, ev in enumerate(_events(), 1):
        body = ev.to_dict()
        rec = make_record(seq, "event", prev, body)
        line, digest = encode_record(seq, "event", prev, canonical_json(body))
        assert line == canonical_json(rec) + b"\n"
        assert digest == rec["hash"]
        prev = digest


def test_encode_record_refuses_non_int_seq() -> None:
    with pytest.raises(TypeError):
        encode_record(True, "event", GENESIS, b"{}")  # type: ignore[arg-type]


def test_to_dict_matches_json_field() -> None:
    for ev in _events():
        expected = {name: v for name in _EVENT_FIELDS if (v := json_field(ev, name)) is not None}
        got = ev.to_dict()
        assert list(got)[2:] == list(expected) and {k: got[k] for k in expected} == expected


def test_scanned_string_cache_still_refuses_secrets() -> None:
    ev = make_events(1)[0]
    assert scrub.scrub_event(ev)[1] == []
    before = scrub._scanned_clean.cache_info()  # session 29 (caches29b): an lru_cache of clean strings
    assert scrub._scanned_clean(ev.tenant) and scrub._scanned_clean.cache_info().hits == before.hits + 1
    bad = AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, tenant="Bearer abcdefghijklmnop")
    for _ in range(2):
        cleaned, dropped = scrub.scrub_event(bad)
        assert cleaned.tenant is None and dropped
    before = scrub._scanned_clean.cache_info()
    with pytest.raises(scrub.SecretFound):  # not cached: scanned again
        scrub._scanned_clean("Bearer abcdefghijklmnop")
    assert scrub._scanned_clean.cache_info().misses == before.misses + 1


def test_shared_json_encodes_once_for_two_sinks_and_stays_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    from audit import encoded

    monkeypatch.setattr(encoded, "SHARED_JSON_MAX", 8)
    monkeypatch.setattr(encoded, "_SHARED", {})
    evs = _events()[:20]
    first = [encoded.shared_json(ev) for ev in evs]
    assert first == [ev.to_json() for ev in evs]
    assert len(encoded._SHARED) == 8  # oldest dropped first
    assert encoded.shared_json(evs[-1]) is first[-1]  # the second sink gets the same bytes
    assert id(evs[-1]) not in encoded._SHARED  # taken twice: removed
    assert encoded.shared_json(evs[0]) == first[0]  # evicted: encoded again, same bytes


class _NoCache(dict):  # type: ignore[type-arg]
    def get(self, key, default=None):  # noqa: ANN001, ANN201 - always a miss
        return default


def test_cef_precomputed_labels_and_number_shortcut_keep_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from audit import cef

    evs = _events() + [AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.DENIED, tenant="a=b\\c\r\nd", model="m|x",
                                  prompt_tokens=-3, status_code=403)]
    fast = [cef.format_cef(ev) for ev in evs]
    monkeypatch.setattr(cef, "_value", lambda v: cef.escape_extension(v if type(v) is str else str(v)))
    monkeypatch.setattr(cef, "_LABELS", _NoCache())
    assert [cef.format_cef(ev) for ev in evs] == fast


def test_otlp_cached_attributes_keep_payload_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    from opentelemetry.proto.common.v1 import common_pb2

    from audit import otlp_log_build as otlp  # the record builder (audit.otlp's sink uses it)
    from audit.otlp import SCOPE_NAME

    evs = _events()
    scope = common_pb2.InstrumentationScope(name=SCOPE_NAME, version="t")
    resource = otlp.build_resource("prefixgate")
    fast = otlp.build_request(evs, resource, scope, 7).SerializeToString()
    again = otlp.build_request(evs, resource, scope, 7).SerializeToString()  # every attribute from the cache
    monkeypatch.setattr(otlp, "_cached_kv", otlp._str_kv)
    assert fast == again == otlp.build_request(evs, resource, scope, 7).SerializeToString()


def test_ocsf_file_one_write_per_batch_same_bytes(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    import asyncio

    import orjson

    from audit import ocsf

    evs = _events()
    path = tmp_path / "ocsf.jsonl"
    sink = ocsf.OcsfFileSink(path)
    writes: list[int] = []

    async def go() -> None:
        await sink.open()
        real = sink._fh
        class Counting:  # counts write calls on the file object
            def write(self, data: bytes) -> int:
                writes.append(len(data))
                return real.write(data)
            def __getattr__(self, name: str):  # noqa: ANN204
                return getattr(real, name)
        sink._fh = Counting()
        await sink.send(evs[:100])
        await sink.send(evs[100:])
        sink._fh = real
        await sink.close()

    asyncio.run(go())
    expected = "".join(orjson.dumps(ocsf.to_ocsf(ev), option=orjson.OPT_SORT_KEYS).decode() + "\n" for ev in evs)
    assert path.read_bytes() == expected.encode("utf-8")
    assert len(writes) == 2


def _reference_otlp(evs, resource, scope, observed_ns):  # noqa: ANN001, ANN202 - the pre-session-6 construction
    from opentelemetry.proto.collector.logs.v1 import logs_service_pb2
    from opentelemetry.proto.common.v1 import common_pb2

    from audit import otlp_log_build as otlp  # the record builder (audit.otlp's sink uses it)

    req = logs_service_pb2.ExportLogsServiceRequest()
    rl = req.resource_logs.add()
    rl.resource.CopyFrom(resource)
    sl = rl.scope_logs.add()
    sl.scope.CopyFrom(scope)
    for ev in evs:
        number, text = otlp.severity_of(ev)
        kind = ev.kind.value
        attrs = [otlp._str_kv("event.name", f"prefixgate.audit.{kind}"), otlp._str_kv("prefixgate.event_id", ev.event_id),
                 otlp._str_kv("prefixgate.outcome", ev.outcome.value)]
        if ev.tenant:
            attrs.append(otlp._str_kv("prefixgate.tenant", ev.tenant))
        rec = sl.log_records.add(time_unix_nano=ev.time_ms * 1_000_000, observed_time_unix_nano=observed_ns,
                                 severity_number=number, severity_text=text,
                                 body=common_pb2.AnyValue(string_value=ev.to_json().decode()), attributes=attrs)
        if otlp.HAS_EVENT_NAME_FIELD:
            rec.event_name = f"prefixgate.audit.{kind}"
        tid = otlp.trace_id_bytes(ev.trace_id)
        if tid is not None:
            rec.trace_id = tid
    return req


def test_otlp_in_place_fields_match_reference_bytes() -> None:
    from opentelemetry.proto.common.v1 import common_pb2

    from audit import otlp_log_build as otlp  # the record builder (audit.otlp's sink uses it)
    from audit.otlp import SCOPE_NAME

    evs = _events()
    scope = common_pb2.InstrumentationScope(name=SCOPE_NAME, version="t")
    resource = otlp.build_resource("prefixgate", {"host.name": "h"})
    expected = _reference_otlp(evs, resource, scope, 9).SerializeToString()
    assert otlp.build_request(evs, resource, scope, 9).SerializeToString() == expected
    assert otlp.build_request(evs, resource, scope, 9).SerializeToString() == expected  # cached attributes
