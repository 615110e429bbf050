"""Session 4 (issue 14): a request's spans are built only when something will record them."""

from __future__ import annotations

import time

import gateway.auditing as auditing
from audit.tracing import memory_exporter, setup_tracing
from gateway.auditing import AuditHub
from gateway.record import RequestRecord


def _finished(hub: AuditHub) -> RequestRecord:
    rec = RequestRecord(request_id="r1", endpoint="/v1/completions", client_addr="127.0.0.1", t0=time.perf_counter())
    hub.start_span(rec, {})
    rec.t_auth = rec.t_parsed = rec.t_keys = rec.t_decided = rec.t_route = rec.t_end = time.perf_counter()
    rec.status, rec.outcome = 200, "allowed"
    return rec


def test_no_exporter_builds_no_span_but_keeps_the_trace_id(monkeypatch):
    hub = AuditHub(None)
    hub.provider = setup_tracing(None)
    calls = []
    monkeypatch.setattr(auditing, "end_request_trace", lambda *a, **k: calls.append(a) or 0)
    rec = _finished(hub)
    want = format(hub.request_trace(rec).context.trace_id, "032x")
    assert hub._end_spans(rec) == (want, None)
    assert calls == []  # nothing records spans: none built


def test_memory_exporter_still_gets_the_server_span_and_its_children():
    hub = AuditHub(None)
    hub.provider = setup_tracing("memory")
    rec = _finished(hub)
    trace_id, _ = hub._end_spans(rec)
    spans = memory_exporter().get_finished_spans()
    assert {s.name for s in spans} >= {"POST /v1/completions", "authenticate", "upstream"}
    assert all(format(s.context.trace_id, "032x") == trace_id for s in spans)
