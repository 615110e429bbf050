"""A request's audit event travels as a flat row (audit.request_event) built on the
request path and turned into the event off it: the event must equal the one the
gateway built before (reference below: the code of gateway/auditing.py before the
row), through the worker pipe's JSON and in process, for any record."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.event import AuditEvent, EventSchemaError, Identity, Kind, Latencies, LedgerInfo, Outcome, PolicyInfo, RouteInfo
from audit.remote import RemoteAuditLog
from audit.request_event import REQUEST_ROW_FIELDS, request_event
from gateway.auditing import AuditHub
from gateway.record import RequestRecord
from tenancy.ledger import Settlement
from tests.audit.test_remote import _events, _section

_OUTCOMES = {o.value: o for o in Outcome}


def _reference_event(rec: RequestRecord, trace_id: str | None, event_id: str, time_ms: int) -> AuditEvent:
    """The event as gateway/auditing.py built it before request rows (verbatim, ids fixed)."""
    s = rec.settlement
    ledger = (LedgerInfo(output_relayed=rec.relayed_output) if s is None else
              LedgerInfo(reserved_tokens=s.reserved, charged_tokens=s.charged, prompt_charged=s.charged_prompt,
                         output_charged=s.charged_output, output_relayed=rec.relayed_output, basis=s.basis))
    return AuditEvent(
        kind=Kind.AUTH if rec.outcome == "unauthenticated" else Kind.INFERENCE,
        outcome=_OUTCOMES.get(rec.outcome, Outcome.FAILED),
        time_ms=time_ms, event_id=event_id,
        request_id=rec.request_id,
        identity=Identity(rec.spiffe_id, rec.trust_domain),
        tenant=rec.tenant_id,
        policy=PolicyInfo(rec.decision_id, rec.reason_code or rec.error_code, rec.reason),
        endpoint=rec.endpoint, model=rec.model, prompt_tokens=rec.prompt_tokens, output_tokens=rec.output_tokens,
        sequences=rec.sequences, ledger=ledger, error_code=rec.error_code,
        route=RouteInfo(rec.replica, rec.pool, rec.routing_policy, rec.available_prefix_tokens,
                        rec.predicted_prefix_tokens, rec.delivered_prefix_tokens, rec.replica_load_tokens),
        latency=Latencies(rec.ms(rec.t0, rec.t_auth), rec.ms(rec.t_auth, rec.t_parsed),
                          rec.ms(rec.t_parsed, rec.t_keys), rec.ms(rec.t_keys, rec.t_decided),
                          rec.ms(rec.t_decided, rec.t_route), rec.ms(rec.t0, rec.t_first_byte),
                          rec.ms(rec.t0, rec.t_end)),
        status_code=rec.status, client_address=rec.client_addr, trace_id=trace_id,
        prefix_fingerprint=rec.prefix_fingerprint,
    )


class _RowCapture:
    """A log with the request-row entry (like RemoteAuditLog): keeps the rows."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def emit_request_row(self, row: tuple[Any, ...]) -> None:
        self.rows.append(row)


class _EventCapture:
    """A log with only ``emit`` (like the test captures and the in-process log)."""

    def __init__(self) -> None:
        self.events: list[AuditEvent] = []

    def emit(self, event: AuditEvent) -> None:
        self.events.append(event)


_text = st.one_of(st.none(), st.text(max_size=40))
_count = st.one_of(st.none(), st.integers(min_value=0, max_value=10**12))
_stamp = st.one_of(st.none(), st.floats(min_value=0.0, max_value=1e7, allow_nan=False))
_outcomes = st.sampled_from([o.value for o in Outcome] + ["unknown-outcome", ""])
_settlement = st.one_of(st.none(), st.builds(
    Settlement, st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**9), st.integers(0, 10**9),
    st.sampled_from(["usage", "relayed", "refused", "reservation", "not_dispatched"])))


@st.composite
def _records(draw: Any) -> RequestRecord:
    rec = RequestRecord(request_id=draw(st.text(min_size=1, max_size=32)), endpoint=draw(st.text(max_size=40)),
                        client_addr=draw(_text), t0=draw(st.floats(min_value=0.0, max_value=1e7)))
    for name in ("spiffe_id", "trust_domain", "tenant_id", "model", "decision_id", "reason_code", "reason",
                 "replica", "pool", "routing_policy", "error_code", "prefix_fingerprint"):
        setattr(rec, name, draw(_text))
    for name in ("prompt_tokens", "sequences", "max_tokens", "output_tokens", "delivered_prefix_tokens",
                 "predicted_prefix_tokens", "available_prefix_tokens", "replica_load_tokens", "relayed_output"):
        setattr(rec, name, draw(_count))
    for name in ("t_auth", "t_parsed", "t_keys", "t_decided", "t_route", "t_first_byte", "t_end"):
        setattr(rec, name, draw(_stamp))
    rec.status = draw(st.one_of(st.none(), st.integers(100, 599)))
    rec.outcome = draw(_outcomes)
    rec.stream = draw(st.booleans())
    rec.attempts = draw(st.integers(0, 5))
    rec.settlement = draw(_settlement)
    return rec


def _hub(log: Any) -> AuditHub:
    return AuditHub(log)  # no provider, no live span: trace_id None


@settings(max_examples=300, deadline=None)
@given(_records())
def test_event_from_the_row_equals_the_event_built_before(rec: RequestRecord) -> None:
    rows, events = _RowCapture(), _EventCapture()
    _hub(rows).record_request(dataclasses.replace(rec, extra={}))
    _hub(events).record_request(dataclasses.replace(rec, extra={}))
    (row,) = rows.rows
    assert len(row) == len(REQUEST_ROW_FIELDS)
    want = _reference_event(rec, None, row[0], row[1])
    # through the worker pipe: the row as JSON, the event built on the other side
    piped = request_event(orjson.loads(orjson.dumps(row)))
    assert piped == want
    assert piped.to_json() == want.to_json()
    # in process (a log without the row entry): the same event
    (inline,) = events.events
    assert inline == dataclasses.replace(want, event_id=inline.event_id, time_ms=inline.time_ms)


@pytest.mark.parametrize("row", [
    None, [], {"event_id": "x"}, ["x"] * (len(REQUEST_ROW_FIELDS) - 1),
    [1, 2, "allowed"] + [None] * (len(REQUEST_ROW_FIELDS) - 3),  # event_id not a string
    ["id", 1.5, "allowed"] + [None] * (len(REQUEST_ROW_FIELDS) - 3),  # time_ms not an int
])
def test_malformed_rows_are_refused(row: Any) -> None:
    with pytest.raises(EventSchemaError):
        request_event(row)


def test_a_stage_stamp_that_is_not_a_number_is_refused() -> None:
    row: list[Any] = ["id", 1, "allowed"] + [None] * (len(REQUEST_ROW_FIELDS) - 3)
    row[REQUEST_ROW_FIELDS.index("t0")] = 1.0
    row[REQUEST_ROW_FIELDS.index("t_auth")] = "2.0"
    with pytest.raises(EventSchemaError):
        request_event(row)


async def test_a_request_row_reaches_the_sinks_through_the_worker(tmp_path: Path) -> None:
    rlog = RemoteAuditLog(_section(tmp_path))
    await rlog.start()
    try:
        rec = RequestRecord(request_id="r-row", endpoint="/v1/completions", client_addr="127.0.0.1", t0=10.0)
        rec.spiffe_id, rec.trust_domain, rec.tenant_id = "spiffe://example.org/a", "example.org", "tenant-a"
        rec.t_auth, rec.t_parsed, rec.t_end, rec.status, rec.outcome = 10.001, 10.0025, 10.01, 200, "allowed"
        rec.settlement = Settlement(10, 5, 10, 1, "usage")
        hub = _hub(rlog)
        hub.record_request(rec)
        assert await rlog.drain(10)
        (body,) = [e for e in _events(tmp_path) if e.get("request_id") == "r-row"]
        want = _reference_event(rec, None, body["event_id"], body["time_ms"])
        assert body == want.to_dict()
        assert rlog.dropped == 0
    finally:
        await rlog.close()

