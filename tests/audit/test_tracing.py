from __future__ import annotations

from audit.tracing import (
    GEN_AI_USAGE_INPUT_TOKENS, HTTP_ROUTE, PG_TENANT, inject_headers, memory_exporter, setup_tracing, start_server_span,
)

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_TP = f"00-{CLIENT_TRACE}-00f067aa0ba902b7-01"


def test_traceparent_is_link_not_parent_and_baggage_dropped():
    provider = setup_tracing("memory", "pg-test")
    tracer = provider.get_tracer("t")
    incoming = {"Traceparent": CLIENT_TP, "baggage": "user=alice", "tracestate": "x=1"}
    with start_server_span(tracer, "POST /v1/chat/completions", incoming, "POST", "/v1/chat/completions") as span:
        span.set_attribute(PG_TENANT, "acme")
        span.set_attribute(GEN_AI_USAGE_INPUT_TOKENS, 48)
        upstream = inject_headers(dict(incoming))
    provider.force_flush()
    (s,) = memory_exporter().get_finished_spans()
    assert s.parent is None
    assert format(s.context.trace_id, "032x") != CLIENT_TRACE
    assert [format(link.context.trace_id, "032x") for link in s.links] == [CLIENT_TRACE]
    assert s.attributes[HTTP_ROUTE] == "/v1/chat/completions" and s.attributes[PG_TENANT] == "acme"
    assert "baggage" not in {k.lower() for k in upstream} and "tracestate" not in upstream
    assert upstream["traceparent"].split("-")[1] == format(s.context.trace_id, "032x")


def test_invalid_traceparent_gives_no_link():
    provider = setup_tracing("memory", "pg-test")
    with start_server_span(provider.get_tracer("t"), "x", {"traceparent": "garbage"}, "GET", "/"):
        pass
    (s,) = memory_exporter().get_finished_spans()
    assert list(s.links) == [] and s.parent is None


def test_finished_child_spans_match_the_sdk_shape_and_follow_sampling():
    from opentelemetry.trace import SpanKind

    from audit.tracing import record_finished_spans

    provider = setup_tracing("memory")
    tracer = provider.get_tracer("prefixgate")
    root = tracer.start_span("POST /v1/completions", kind=SpanKind.SERVER, start_time=1_000)
    assert record_finished_spans(provider, root, [("policy", SpanKind.INTERNAL, 1_100, 1_200),
                                                  ("upstream", SpanKind.CLIENT, 1_200, 1_900)]) == 2
    root.end(end_time=2_000)
    spans = {s.name: s for s in memory_exporter().get_finished_spans()}
    rsc = spans["POST /v1/completions"].context
    for name, kind, start, end in (("policy", SpanKind.INTERNAL, 1_100, 1_200), ("upstream", SpanKind.CLIENT, 1_200, 1_900)):
        s = spans[name]
        assert s.context.trace_id == rsc.trace_id and s.parent.span_id == rsc.span_id
        assert s.context.span_id not in (0, rsc.span_id) and s.kind == kind
        assert (s.start_time, s.end_time) == (start, end)
        assert s.resource.attributes["service.name"] == "prefixgate"
        assert s.instrumentation_scope.name == "prefixgate"

    none = setup_tracing("memory", sample_ratio=0.0)
    root = none.get_tracer("prefixgate").start_span("POST /v1/completions")
    assert not root.is_recording() and root.get_span_context().is_valid  # trace id still known (audit event)
    assert record_finished_spans(none, root, [("policy", SpanKind.INTERNAL, 1, 2)]) == 0
    root.end()
    assert memory_exporter().get_finished_spans() == ()


def test_sample_ratio_outside_0_1_is_refused():
    import pytest

    from audit.tracing import TracingConfigError

    with pytest.raises(TracingConfigError):
        setup_tracing(None, sample_ratio=1.5)
