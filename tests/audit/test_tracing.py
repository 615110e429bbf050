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
