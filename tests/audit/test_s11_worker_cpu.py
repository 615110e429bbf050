"""Session 11 (issue 14): the audit worker's per-event shortcuts give exactly what the general code gives.

* ``audit.request_event.request_event`` sets the event's slots directly and shares one ``Identity``
  per workload: the event equals (and encodes like) the one ``AuditEvent(...)`` builds, for odd rows too.
* ``audit.row_spans.row_span_bytes`` writes the plain server span itself: the same bytes as
  ``audit.otlp_pb.span_message`` of its attribute dict, for odd attribute values too (they take
  ``span_message``).
"""
from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from audit import row_spans
from audit.event import AuditEvent, EventSchemaError, Identity, Kind, Latencies, LedgerInfo, Outcome, PolicyInfo, RouteInfo
from audit.otlp_pb import len_field, span_message
from audit.request_event import REQUEST_ROW_FIELDS, _ms, request_event
from audit.row_spans import row_span_bytes, span_attributes
from tests.audit.test_s9_otlp_pb import _row

_ODD = [None, 0, 1, -1, 2**63 - 1, 2**63, True, False, 1.5, float("inf"), "", "ü", "x" * 300, "m", 200, 503,
        [1, 2], {"a": 1}]


def _reference_event(row: list[Any], instance: str | None) -> AuditEvent:
    """request_event as it was before session 11 (the dataclass constructors)."""
    (event_id, time_ms, outcome, request_id, spiffe_id, trust_domain, tenant,
     decision_id, reason_code, reason, endpoint, model, prompt_tokens, output_tokens, sequences,
     reserved, charged, prompt_charged, output_charged, output_relayed, basis,
     error_code, replica, pool, routing_policy, available, predicted, delivered, load,
     t0, t_auth, t_parsed, t_keys, t_decided, t_route, t_first_byte, t_end,
     status_code, client_address, trace_id, prefix_fingerprint, virtual_tokens, queue_wait_ms, dropped_fields,
     policy_version) = row
    if type(event_id) is not str or type(outcome) is not str or type(time_ms) is not int:
        raise EventSchemaError("wrong type")
    return AuditEvent(
        kind=Kind.AUTH if outcome == "unauthenticated" else Kind.INFERENCE,
        outcome={o.value: o for o in Outcome}.get(outcome, Outcome.FAILED), time_ms=time_ms, event_id=event_id,
        request_id=request_id, identity=Identity(spiffe_id, trust_domain), tenant=tenant,
        policy=PolicyInfo(decision_id, reason_code, reason, policy_version), endpoint=endpoint, model=model,
        prompt_tokens=prompt_tokens, output_tokens=output_tokens, sequences=sequences,
        ledger=LedgerInfo(reserved, charged, prompt_charged, output_charged, output_relayed, basis),
        error_code=error_code,
        route=RouteInfo(replica, pool, routing_policy, available, predicted, delivered, load, virtual_tokens),
        latency=Latencies(_ms(t0, t_auth), _ms(t_auth, t_parsed), _ms(t_parsed, t_keys), _ms(t_keys, t_decided),
                          _ms(t_decided, t_route), _ms(t0, t_first_byte), _ms(t0, t_end), queue_wait_ms),
        status_code=status_code, client_address=client_address, trace_id=trace_id,
        prefix_fingerprint=prefix_fingerprint, instance=instance, dropped_fields=dropped_fields)


def _outcome(rng: random.Random) -> Any:
    return rng.choice(["allowed", "denied", "unauthenticated", "bogus", "failed"])


@pytest.mark.parametrize("seed", range(6))
def test_request_event_equals_the_dataclass_built_event(seed: int) -> None:
    rng = random.Random(seed)
    for i in range(400):
        row = _row(rng, i)
        row[2] = _outcome(rng)
        for _ in range(rng.randrange(0, 4)):  # odd values anywhere but the checked three
            row[rng.randrange(3, len(REQUEST_ROW_FIELDS))] = rng.choice(_ODD)
        if rng.random() < 0.3:  # every stamp a float: the inlined latency path
            t = rng.uniform(1, 1000)
            for k, name in enumerate(("t0", "t_auth", "t_parsed", "t_keys", "t_decided", "t_route",
                                      "t_first_byte", "t_end")):
                row[REQUEST_ROW_FIELDS.index(name)] = t + k * rng.uniform(0, 0.01)
        instance = rng.choice([None, "host/w1"])
        try:
            want = _reference_event(row, instance)
        except (EventSchemaError, TypeError) as exc:
            with pytest.raises(type(exc)):
                request_event(row, instance)
            continue
        got = request_event(row, instance)
        assert got == want
        assert type(got) is AuditEvent
        try:
            want_json = want.to_json()
        except TypeError:  # a value JSON cannot hold (a float("inf") stays a float; lists do encode)
            continue
        assert got.to_json() == want_json


def test_request_event_is_still_frozen_and_shares_identities() -> None:
    rng = random.Random(1)
    a, b = request_event(_row(rng, 1)), request_event(_row(rng, 2))
    assert a.identity is b.identity  # same workload
    with pytest.raises(AttributeError):
        a.tenant = "other"  # type: ignore[misc]
    with pytest.raises(EventSchemaError):
        request_event(["e", 1, "allowed"])


def _reference_server_span(row: list[Any], extra: Any) -> bytes:
    span_id, _flags, start_ns, links, state = extra
    tid = int(row[row_spans._TRACE], 16).to_bytes(16, "big")
    endpoint = row[row_spans._ENDPOINT]
    _children, end = row_spans.stage_children(start_ns, [row[k] for k in row_spans._MARKS])
    status = row[row_spans._ATTRS[0]]
    attributes = {"http.request.method": "POST", "http.route": endpoint,
                  **span_attributes(*(row[k] for k in row_spans._ATTRS))}
    return span_message(tid, span_id, state, None, "POST " + endpoint, row_spans._SERVER_KIND1, start_ns,
                        end if end is not None else row[row_spans._TIME_MS] * 1_000_000, attributes,
                        row_spans._ERROR_CODE if status and status >= 500 else 0, None, links, 0, 0,
                        row_spans._FLAGS_LOCAL)


@pytest.mark.parametrize("seed", range(6))
def test_server_span_bytes_equal_span_message(seed: int) -> None:
    rng = random.Random(seed)
    compared = 0
    for i in range(600):
        row = _row(rng, i)
        for _ in range(rng.randrange(0, 3)):
            row[rng.choice(row_spans._ATTRS)] = rng.choice(_ODD[:-2])
        extra = (rng.getrandbits(64) or 1, 1, 1_764_000_000_000_000_000 + i, None, rng.choice([None, "a=b", ""]))
        row = orjson.loads(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY))  # as decoded from the frame
        try:
            want = _reference_server_span(row, extra)
        except Exception:  # noqa: BLE001 -- the reference refuses: row_span_bytes must raise too
            with pytest.raises(Exception):  # noqa: B017
                row_span_bytes(row, extra, iter(range(1, 100)).__next__)
            continue
        got, _n = row_span_bytes(row, extra, iter(range(1, 100)).__next__)
        assert got.endswith(len_field(b"\x12", want))
        compared += 1
    assert compared > 300


@pytest.mark.parametrize("seed", range(6))
def test_shared_json_equals_to_json(seed: int) -> None:
    from audit.encoded import _SHARED, shared_json

    rng = random.Random(seed)
    for i in range(400):
        row = _row(rng, i)
        row[2] = _outcome(rng)
        for _ in range(rng.randrange(0, 4)):
            row[rng.randrange(3, len(REQUEST_ROW_FIELDS))] = rng.choice(_ODD)
        try:
            ev = request_event(row, rng.choice([None, "host/w1", "ü"]))
            want = ev.to_json()
        except (EventSchemaError, TypeError):
            continue
        _SHARED.clear()
        assert shared_json(ev) == want
    # events with kind-specific details, and odd top-level values, take to_json
    for ev in (AuditEvent(kind=Kind.ALERT, outcome=Outcome.RAISED, alert={"alert_id": "a", "n": 1}),
               AuditEvent(kind=Kind.CHECKPOINT, outcome=Outcome.SEALED, checkpoint={"head_seq": 3}),
               AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, tenant=Kind.AUTH),  # type: ignore[arg-type]
               AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, identity=Identity(None, None),
                          route=RouteInfo(replica="r0"), latency=Latencies(total_ms=1.5))):
        _SHARED.clear()
        assert shared_json(ev) == ev.to_json()


def test_shared_json_sorts_a_mapping_inside_a_group_as_to_json_does() -> None:
    """R11b-4: the chain hashes shared_json's bytes as canonical JSON (sorted keys at every depth)."""
    from audit.encoded import _SHARED, shared_json

    ev = AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, time_ms=1764640000123,
                    latency=Latencies(first_byte_ms={"b": 1, "a": 2}))  # type: ignore[arg-type]
    _SHARED.clear()
    got = shared_json(ev)
    assert got == ev.to_json()
    assert b'{"a":2,"b":1}' in got


def test_default_child_span_ids_are_random_nonzero_and_parented() -> None:
    from opentelemetry.proto.trace.v1 import trace_pb2

    rng = random.Random(3)
    row = _row(rng, 1)
    t = 100.0
    for k, name in enumerate(("t0", "t_auth", "t_parsed", "t_keys", "t_decided", "t_route", "t_first_byte", "t_end")):
        row[REQUEST_ROW_FIELDS.index(name)] = t + k * 0.001  # every stage ran: the one-draw ids
    extra = (0x1234, 1, 1_764_000_000_000_000_000, None, None)
    seen = set()
    for _ in range(50):
        data, n = row_span_bytes(row, extra)
        spans = trace_pb2.ScopeSpans.FromString(data).spans
        assert n == len(spans) == 7
        children, server = spans[:6], spans[6]
        assert server.span_id == (0x1234).to_bytes(8, "big") and not server.parent_span_id
        for c in children:
            assert c.parent_span_id == server.span_id and c.span_id != bytes(8)
            seen.add(c.span_id)
        ids = iter(range(1, 100))
        same, _ = row_span_bytes(row, extra, ids.__next__)
        assert len(same) == len(data)
    assert len(seen) == 300  # fresh ids every time
