"""Issue 14: the upstream ``traceparent``/``tracestate`` of a request trace are written directly,
byte for byte what OpenTelemetry's W3C propagator writes; no client ``traceparent``: no link, and
no propagator work."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import audit.tracing as tracing
from audit.tracing import RequestTrace, incoming_links, request_trace_headers

_keys = st.from_regex(r"[a-z][a-z0-9_\-]{0,8}", fullmatch=True)
_vals = st.from_regex(r"[a-zA-Z0-9]{1,8}", fullmatch=True)


def _rt(ctx: SpanContext) -> RequestTrace:
    return RequestTrace(None, "POST /v1/completions", ctx, 0, (), {})  # type: ignore[arg-type]


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**128 - 1), st.integers(0, 2**64 - 1), st.sampled_from([0, 1]),
       st.dictionaries(_keys, _vals, max_size=3), st.booleans())
def test_headers_equal_the_propagators(trace_id: int, span_id: int, flags: int, state: dict[str, str],
                                       remote: bool) -> None:
    ctx = SpanContext(trace_id, span_id, remote, TraceFlags(flags), TraceState(list(state.items())))
    ours: dict[str, str] = {"X-Request-Id": "r"}
    request_trace_headers(_rt(ctx), ours)
    theirs: dict[str, str] = {"X-Request-Id": "r"}
    TraceContextTextMapPropagator().inject(theirs, context=trace.set_span_in_context(NonRecordingSpan(ctx)))
    assert ours == theirs


def test_no_propagator_work_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **kw: object) -> None:
        raise AssertionError("propagator called")

    monkeypatch.setattr(tracing._PROPAGATOR, "inject", boom)
    monkeypatch.setattr(tracing._PROPAGATOR, "extract", boom)
    ctx = SpanContext(1, 2, False, TraceFlags(1))
    headers: dict[str, str] = {}
    request_trace_headers(_rt(ctx), headers)
    assert headers == {"traceparent": "00-00000000000000000000000000000001-0000000000000002-01"}
    assert incoming_links({"content-type": "application/json"}) == []


def test_client_traceparent_is_still_a_link() -> None:
    links = incoming_links({"TraceParent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"})
    assert len(links) == 1 and links[0].context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert incoming_links({"traceparent": "garbage"}) == []
