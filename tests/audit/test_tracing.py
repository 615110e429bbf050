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


def test_request_trace_exports_the_server_span_and_children_with_the_sdk_shape():
    from opentelemetry.trace import Link, SpanContext, SpanKind, StatusCode, TraceFlags

    from audit.tracing import begin_request_trace, end_request_trace, request_trace_headers

    provider = setup_tracing("memory")
    client = SpanContext(0xABC, 0xDEF, True, TraceFlags(1))
    rt = begin_request_trace(provider, "POST /v1/completions", [Link(client)], {HTTP_ROUTE: "/v1/completions"})
    assert rt is not None and rt.context.trace_id != client.trace_id  # a new root, never the client's trace
    headers: dict[str, str] = {}
    request_trace_headers(rt, headers)
    assert headers["traceparent"] == f"00-{rt.context.trace_id:032x}-{rt.context.span_id:016x}-01"
    children = [("policy", SpanKind.INTERNAL, rt.start_ns + 100, rt.start_ns + 200),
                ("upstream", SpanKind.CLIENT, rt.start_ns + 200, rt.start_ns + 900)]
    assert end_request_trace(rt, rt.start_ns + 1000, {PG_TENANT: "tenant-a"}, True, children) == 3
    spans = {s.name: s for s in memory_exporter().get_finished_spans()}
    server = spans["POST /v1/completions"]
    assert server.kind == SpanKind.SERVER and server.parent is None and server.context == rt.context
    assert server.attributes[PG_TENANT] == "tenant-a" and server.attributes[HTTP_ROUTE] == "/v1/completions"
    assert server.status.status_code == StatusCode.ERROR
    assert [lk.context.span_id for lk in server.links] == [client.span_id]
    for name, kind, start, end in children:
        s = spans[name]
        assert s.context.trace_id == rt.context.trace_id and s.parent.span_id == rt.context.span_id
        assert s.context.span_id not in (0, rt.context.span_id) and s.kind == kind
        assert (s.start_time, s.end_time) == (start, end)
        assert s.resource.attributes["service.name"] == "prefixgate"
        assert s.instrumentation_scope.name == "prefixgate"

    unsampled = setup_tracing("memory", sample_ratio=0.0)
    rt = begin_request_trace(unsampled, "POST /v1/completions", [], {})
    assert rt is not None and rt.context.is_valid and not rt.context.trace_flags.sampled  # trace id for the audit event
    assert end_request_trace(rt, rt.start_ns + 1, {}, False, children) == 0
    assert memory_exporter().get_finished_spans() == ()


def test_sample_ratio_outside_0_1_is_refused():
    import pytest

    from audit.tracing import TracingConfigError

    with pytest.raises(TracingConfigError):
        setup_tracing(None, sample_ratio=1.5)
