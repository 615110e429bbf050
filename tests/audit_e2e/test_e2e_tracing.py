"""Against the running app: OpenTelemetry spans (in-memory exporter) per request.

One SERVER span per request with INTERNAL children authenticate/parse/prefix_keys/policy/route and a
CLIENT child upstream; HTTP and gen_ai semantic-convention attributes plus PrefixGate's
own; the client's traceparent is a link, never the parent; its baggage and tracestate
are dropped; the gateway's own traceparent reaches the replica; the audit event
carries the trace id.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.trace import SpanKind

sys.path.insert(0, os.path.dirname(__file__))
from e2e_helpers import PROMPT, audit_section, jsonl_events, wait_for  # noqa: E402

import gateway.pipeline  # noqa: E402
from audit.tracing import memory_exporter  # noqa: E402
from gateway.auditing import AuditHub  # noqa: E402

CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


@pytest.fixture
def audit_hub(tmp_path: Path) -> AuditHub:
    hub = AuditHub.from_config(audit_section(tmp_path), tracing={"exporter": "memory"})
    hub.exporter = memory_exporter()  # type: ignore[attr-defined]
    return hub


@pytest.fixture
def upstream_headers(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, str]]:
    """Headers of every upstream call the gateway makes (captured at the aiohttp call)."""
    seen: list[dict[str, str]] = []
    original = gateway.pipeline.open_upstream

    async def capture(session: Any, url: str, body: dict[str, Any], headers: dict[str, str], timeout_s: float,
                      *guard: Any) -> Any:  # guard: the decision's generation (session 19, S19-RC6)
        seen.append(dict(headers))
        return await original(session, url, body, headers, timeout_s, *guard)

    monkeypatch.setattr(gateway.pipeline, "open_upstream", capture)
    return seen


async def test_spans_links_propagation_and_trace_id(stack, upstream_headers, tmp_path: Path) -> None:
    exporter = stack.components.audit.exporter
    client_headers = {
        **stack.auth(),
        "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
        "tracestate": "vendor=secret",
        "baggage": "tenant=tenant-b,user=mallory",
    }
    r = await stack.client.post("/v1/completions", headers=client_headers,
                                json={"model": "sim-model", "prompt": PROMPT, "max_tokens": 4})
    assert r.status_code == 200
    r2 = await stack.client.post("/v1/completions", headers={"Authorization": "Bearer nope"},
                                 json={"model": "sim-model", "prompt": PROMPT})
    assert r2.status_code == 401
    await wait_for(lambda: len([s for s in exporter.get_finished_spans() if s.kind is SpanKind.SERVER]) >= 2)
    spans = exporter.get_finished_spans()
    servers = [s for s in spans if s.kind is SpanKind.SERVER]
    assert len(servers) == 2  # one server span per request
    ok = next(s for s in servers if s.attributes["http.response.status_code"] == 200)
    ctx = ok.get_span_context()
    # the client's traceparent is a link, not the parent: new root, new trace id
    assert ok.parent is None and format(ctx.trace_id, "032x") != CLIENT_TRACE
    assert [format(link.context.trace_id, "032x") for link in ok.links] == [CLIENT_TRACE]
    assert format(ok.links[0].context.span_id, "016x") == CLIENT_SPAN
    # children with the recorded stage timestamps
    children = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == ctx.span_id}
    assert set(children) == {"authenticate", "parse", "prefix_keys", "policy", "route", "upstream"}
    assert children["upstream"].kind is SpanKind.CLIENT and children["policy"].kind is SpanKind.INTERNAL
    for child in children.values():
        assert child.get_span_context().trace_id == ctx.trace_id
        assert ok.start_time <= child.start_time <= child.end_time <= ok.end_time
    assert children["authenticate"].end_time <= children["policy"].end_time <= children["route"].end_time
    # semantic-convention attributes (HTTP server, gen_ai) and PrefixGate's own
    a = ok.attributes
    assert a["http.request.method"] == "POST" and a["http.route"] == "/v1/completions"
    assert a["gen_ai.request.model"] == "sim-model"
    assert a["gen_ai.usage.input_tokens"] == 101 and a["gen_ai.usage.output_tokens"] == 4
    assert a["prefixgate.tenant"] == "tenant-a" and a["prefixgate.replica"] in ("r0", "r1")
    assert a["prefixgate.decision_id"] and "prefixgate.predicted_prefix_tokens" in a
    assert not any("baggage" in k or "mallory" in str(v) for k, v in a.items())
    # the gateway's own context reaches the replica; client baggage/tracestate/credentials do not
    (up,) = upstream_headers
    lowered = {k.lower(): v for k, v in up.items()}
    assert "baggage" not in lowered and "tracestate" not in lowered and "authorization" not in lowered
    version, trace_id, span_id, flags = lowered["traceparent"].split("-")
    assert trace_id == format(ctx.trace_id, "032x") and trace_id != CLIENT_TRACE
    assert span_id in {format(s.get_span_context().span_id, "016x") for s in [ok, *children.values()]}
    # the audit event names the trace
    await stack.components.audit.log.drain()
    events = [e for e in jsonl_events(tmp_path) if e.get("request_id")]
    allowed = next(e for e in events if e["outcome"] == "allowed")
    assert allowed["trace_id"] == trace_id
    unauth = next(e for e in events if e["outcome"] == "unauthenticated")
    bad = next(s for s in servers if s is not ok)
    assert unauth["trace_id"] == format(bad.get_span_context().trace_id, "032x")
    assert bad.attributes["http.response.status_code"] == 401 and not bad.links
