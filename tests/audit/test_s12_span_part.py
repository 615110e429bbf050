"""Issue 14, session 12: a request whose spans the audit worker builds (or that is not sampled) gets its
span part straight from its :class:`audit.tracing.TraceStart`, without the :class:`audit.tracing.RequestTrace`
(span context, links list, attributes) the gateway made for it before: the row's trace id and the span
extra are the ones the trace made, with or without a client ``traceparent``, sampled or not, whether the
part is prepared while the replica works or at the request's end."""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.datastructures import Headers

from audit import tracing
from audit.row_spans import span_extra
from gateway.auditing import AuditHub
from gateway.record import RequestRecord

TP = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class _RowLog:
    """Captures request rows and span extras as the audit worker log would get them."""

    accepting, dropped = True, 0

    def __init__(self) -> None:
        self.rows: list[tuple[Any, Any]] = []

    def emit_request_row(self, row: Any, spans: Any = None) -> None:
        self.rows.append((row, spans))


def _hub(ratio: float) -> tuple[AuditHub, _RowLog]:
    log = _RowLog()
    hub = AuditHub(log)
    hub.provider, hub.worker_spans = tracing.setup_tracing(None, sample_ratio=ratio), True
    return hub, log


def _want(ts: tracing.TraceStart, endpoint: str) -> tuple[str, tuple | None]:
    """What the session 11 path made: the trace, then span_extra of its context, start and links."""
    rt = AuditHub.request_trace(RequestRecord(request_id="x", endpoint=endpoint, client_addr=None, t0=0.0,
                                              extra={"trace": ts}))
    assert rt is not None
    sc = rt.context
    return format(sc.trace_id, "032x"), (span_extra(sc, ts.start_ns, rt.links) if sc.trace_flags.sampled else None)


@settings(max_examples=60, deadline=None)
@given(link=st.booleans(), sampled=st.booleans(), prepared=st.booleans(),
       endpoint=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_the_span_part_from_the_ids_is_the_one_the_trace_made(link: bool, sampled: bool, prepared: bool,
                                                              endpoint: str) -> None:
    hub, log = _hub(1.0 if sampled else 0.0)
    rec = RequestRecord(request_id="r", endpoint=endpoint, client_addr="127.0.0.1", t0=time.perf_counter())
    hub.start_span(rec, Headers(raw=[(b"traceparent", TP)] if link else []))
    ts = rec.extra["trace"]
    assert type(ts) is tracing.TraceStart
    want = _want(ts, endpoint)
    sent: dict[str, str] = {}
    hub.inject_trace_headers(sent, rec)
    if prepared:
        hub.prepare_request(rec)
        assert type(rec.extra["trace"]) is tracing.TraceStart  # no RequestTrace made
    rec.status, rec.outcome, rec.t_end = 200, "allowed", time.perf_counter()
    hub.emit_request(rec)
    (row, extra), = log.rows
    assert (row[39], extra) == want
    assert sent["traceparent"][3:35] == row[39]
    assert rec.extra == {}  # nothing of the trace is left in the record
    if link and sampled:
        assert extra is not None and extra[3] and extra[3][0][2] == 0x00F067AA0BA902B7  # the client's span, a link


def test_a_trace_recorded_in_this_process_is_still_made_whole() -> None:
    hub = AuditHub(None)
    hub.provider = tracing.setup_tracing("memory")
    rec = RequestRecord(request_id="r", endpoint="/v1/completions", client_addr=None, t0=time.perf_counter())
    hub.start_span(rec, {})
    hub.prepare_request(rec)
    assert type(rec.extra["trace"]) is tracing.RequestTrace
    rec.t_end = time.perf_counter()
    trace_id, extra = hub._end_spans(rec)
    spans = tracing.memory_exporter().get_finished_spans()
    assert extra is None and spans and format(spans[-1].context.trace_id, "032x") == trace_id


@pytest.mark.parametrize("prepared", [True, False])
def test_an_unsampled_trace_recorded_elsewhere_sends_only_its_id(prepared: bool) -> None:
    hub = AuditHub(None)
    hub.provider = tracing.setup_tracing("memory", sample_ratio=0.0)
    rec = RequestRecord(request_id="r", endpoint="/v1/completions", client_addr=None, t0=time.perf_counter())
    hub.start_span(rec, {})
    ts = rec.extra["trace"]
    if prepared:
        hub.prepare_request(rec)
    assert hub._end_spans(rec) == (format(ts.trace_id, "032x"), None)


@given(trace_id=st.integers(1, (1 << 128) - 1), span_id=st.integers(1, (1 << 64) - 1), sampled=st.booleans(),
       made=st.booleans())
def test_the_trace_hex_is_the_formatted_id_with_or_without_the_header(trace_id: int, span_id: int, sampled: bool,
                                                                       made: bool) -> None:
    flags = tracing.TraceFlags(tracing.TraceFlags.SAMPLED if sampled else tracing.TraceFlags.DEFAULT)
    ts = tracing.TraceStart(None, (), trace_id, span_id, flags, 0, None)  # type: ignore[arg-type]
    if made:
        assert ts.traceparent() == ts.traceparent() == f"00-{trace_id:032x}-{span_id:016x}-{int(flags):02x}"
    assert ts.trace_hex() == format(trace_id, "032x")
