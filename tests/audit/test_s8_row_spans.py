"""Session 8 (issue 14): the audit worker builds a request's spans from its request row.

The record the worker makes from a row and its span extra (audit/row_spans.py) must be, byte for
byte after the pipe's JSON, the record the gateway made itself before (AuditHub._end_spans into
the offload processor); and through AuditHub.from_config with the worker process and an OTLP
collector, the spans arrive with the audit event's trace id while the gateway builds none.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import orjson
import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

import audit.tracing as tracing
from audit.request_event import REQUEST_ROW_FIELDS
from audit.row_spans import row_span_record
from gateway.auditing import AuditHub
from gateway.record import RequestRecord
from tests.audit.test_span_offload import collector  # noqa: F401 -- fixture
from tests.audit_e2e.e2e_helpers import audit_section, jsonl_events
from tests.support.waiting import wait_for


class _Capture:
    """An offload-processor stand-in: the records the gateway's own path hands over."""

    def __init__(self) -> None:
        self.records: list[tuple] = []

    def on_end_request(self, record: tuple) -> None:
        self.records.append(record)


class _RowLog:
    accepting, dropped = True, 0

    def __init__(self) -> None:
        self.rows: list[tuple[Any, Any]] = []

    def emit_request_row(self, row: Any, spans: Any = None) -> None:
        self.rows.append((row, spans))


def _wire(x: Any) -> Any:
    return orjson.loads(orjson.dumps(x))


_opt_int = st.one_of(st.none(), st.integers(0, 1 << 20))
_opt_text = st.one_of(st.none(), st.text(max_size=12))


@settings(max_examples=150, deadline=None)
@given(status=st.one_of(st.none(), st.sampled_from([200, 401, 429, 500, 503])), model=_opt_text, prompt=_opt_int,
       output=_opt_int, tenant=_opt_text, replica=_opt_text, predicted=_opt_int, decision=_opt_text,
       outcome=st.sampled_from(["allowed", "denied", "failed", "unauthenticated"]),
       present=st.lists(st.booleans(), min_size=5, max_size=5), gaps=st.lists(st.floats(0, 2), min_size=6, max_size=6),
       link=st.booleans(), endpoint=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_the_worker_record_is_the_record_the_gateway_made(status, model, prompt, output, tenant, replica, predicted,
                                                          decision, outcome, present, gaps, link, endpoint) -> None:
    provider = tracing.setup_tracing(None)
    old = AuditHub(None)
    old.provider = provider
    cap = _Capture()
    log = _RowLog()
    new = AuditHub(log)
    new.provider, new.worker_spans = provider, True
    t0 = 5000.123456
    stamps, t = [], t0
    for gap, here in zip(gaps, [*present, True]):  # t_end always set (the gateway's default end is "now")
        t += gap
        stamps.append(t if here else None)
    headers = Headers(raw=[(b"traceparent", b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")] if link else [])
    rec = RequestRecord(request_id="r", endpoint=endpoint, client_addr="127.0.0.1", t0=t0)
    rec.t_auth, rec.t_parsed, rec.t_keys, rec.t_decided, rec.t_route, rec.t_end = stamps
    rec.status, rec.model, rec.prompt_tokens, rec.output_tokens = status, model, prompt, output
    rec.tenant_id, rec.replica, rec.predicted_prefix_tokens, rec.decision_id, rec.outcome = (
        tenant, replica, predicted, decision, outcome)
    old.start_span(rec, headers)
    rt, wall0 = old.request_trace(rec), rec.extra["wall0_ns"]
    twin = dataclasses.replace(rec, extra={"trace": dataclasses.replace(rt, processors=()), "wall0_ns": wall0})
    rec.extra["trace"] = dataclasses.replace(rt, processors=(cap,))
    old.emit_request(rec)
    new.emit_request(twin)
    (row, extra), = log.rows
    assert extra is not None and row[39] == format(rt.context.trace_id, "032x")  # the event's trace id
    want, = cap.records
    assert orjson.dumps(row_span_record(_wire(row), _wire(extra))) == orjson.dumps(want)


def test_an_unsampled_trace_sends_no_span_extra_and_a_missing_end_uses_the_event_time() -> None:
    log = _RowLog()
    hub = AuditHub(log)
    hub.provider, hub.worker_spans = tracing.setup_tracing(None, sample_ratio=0.0), True
    rec = RequestRecord(request_id="r", endpoint="/v1/completions", client_addr=None, t0=time.perf_counter())
    hub.start_span(rec, {})
    hub.emit_request(rec)
    (row, extra), = log.rows
    assert extra is None and row[39] is not None  # the trace id stays in the event
    hub.provider = tracing.setup_tracing(None)
    rec = RequestRecord(request_id="r", endpoint="/v1/completions", client_addr=None, t0=time.perf_counter())
    hub.start_span(rec, {})
    hub.emit_request(rec)  # no stage ran, no t_end
    row, extra = log.rows[-1]
    record = row_span_record(_wire(row), _wire(extra))
    assert record[12] == [] and record[8] == row[1] * 1_000_000


def test_a_malformed_span_extra_is_refused() -> None:
    with pytest.raises((ValueError, TypeError)):
        row_span_record([None] * len(REQUEST_ROW_FIELDS), ["x", 1, 2, None, None])


async def test_worker_exports_the_spans_of_the_rows(tmp_path: Path, collector) -> None:  # noqa: F811
    col, url = collector
    hub = AuditHub.from_config(audit_section(tmp_path), tracing={"exporter": "otlp", "otlp_endpoint": url})
    assert hub.worker_spans and not tracing.records(tracing.begin_request_trace(hub.provider, "x", [], {}))
    await hub.start()
    try:
        ids = []
        for i in range(3):
            rec = RequestRecord(request_id=f"r{i}", endpoint="/v1/completions", client_addr="127.0.0.1",
                                t0=time.perf_counter())
            hub.start_span(rec, {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"})
            headers: dict[str, str] = {}
            hub.inject_trace_headers(headers, rec)
            rec.t_auth = rec.t_parsed = rec.t_keys = rec.t_decided = rec.t_route = rec.t_end = time.perf_counter()
            rec.status, rec.outcome, rec.tenant_id, rec.replica = 200, "allowed", "tenant-a", "r0"
            ids.append(headers["traceparent"].split("-")[1])
            hub.emit_request(rec)
            hub.hand_off()
        await col.wait_for(lambda: len(col.spans) >= 21)
        # no span exporter child at all: the worker POSTs the spans itself (session 10, audit/span_post.py)
        me = psutil.Process()
        assert not [c for c in me.children(recursive=True) if "audit.span_exporter_proc" in " ".join(c.cmdline())]
    finally:
        await hub.close()
    servers = [s for _, _, s in col.spans if s.name == "POST /v1/completions"]
    assert sorted(s.trace_id.hex() for s in servers) == sorted(ids)
    attrs = {kv.key: kv.value for kv in servers[0].attributes}
    assert attrs["prefixgate.tenant"].string_value == "tenant-a" and attrs["http.response.status_code"].int_value == 200
    assert [link.trace_id.hex() for link in servers[0].links] == ["4bf92f3577b34da6a3ce929d0e0e4736"]
    assert all(r.get("service.name") == "prefixgate" for r, _, _ in col.spans)
    await wait_for(lambda: len([e for e in jsonl_events(tmp_path) if e.get("kind") == "inference"]) >= 3)
    assert sorted(e["trace_id"] for e in jsonl_events(tmp_path) if e.get("kind") == "inference") == sorted(ids)


async def test_a_malformed_span_extra_loses_no_audit_event(tmp_path: Path, collector) -> None:  # noqa: F811
    _, url = collector
    hub = AuditHub.from_config(audit_section(tmp_path), tracing={"exporter": "otlp", "otlp_endpoint": url})
    log = hub.log
    sent = []
    hub._emit_row = lambda row, spans=None: sent.append(row) or log.emit_request_row(row, ["bad", 1, 2, None, None])
    await hub.start()
    try:
        rec = RequestRecord(request_id="r-bad", endpoint="/v1/completions", client_addr=None, t0=time.perf_counter())
        hub.start_span(rec, {})
        rec.t_end, rec.status, rec.outcome = time.perf_counter(), 200, "allowed"
        hub.emit_request(rec)
        hub.hand_off()
        assert await log.drain(10.0)
    finally:
        await hub.close()
    assert [e["event_id"] for e in jsonl_events(tmp_path) if e.get("kind") == "inference"] == [sent[0][0]]
    assert hub.dropped == 0


async def test_close_with_a_dead_collector_leaves_no_exporter_child(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1/traces"
    hub = AuditHub.from_config(audit_section(tmp_path), tracing={"exporter": "otlp", "otlp_endpoint": url})
    await hub.start()
    for i in range(50):
        rec = RequestRecord(request_id=f"r{i}", endpoint="/v1/completions", client_addr=None, t0=time.perf_counter())
        hub.start_span(rec, {})
        rec.t_end, rec.status, rec.outcome = time.perf_counter(), 200, "allowed"
        hub.emit_request(rec)
        hub.hand_off()
    await wait_for(lambda: bool(psutil.Process().children(recursive=True)))
    kids = psutil.Process().children(recursive=True)
    assert not [k for k in kids if "audit.span_exporter_proc" in " ".join(k.cmdline())]  # session 10: none
    await hub.close()
    await wait_for(lambda: not [k for k in kids if k.is_running() and k.status() != psutil.STATUS_ZOMBIE])
    assert hub.dropped == 0
