"""Session 7 (issue 14): the hub's stage spans (AuditHub._end_spans, each stage mark converted to epoch
ns once): a child per stage whose two marks are set, from mark i to mark i + 1, ``upstream`` a CLIENT
span, each at ``wall0 + int((t - t0) * 1e9)``; the server span ends at ``t_end``."""
from __future__ import annotations

import pytest
from opentelemetry.trace import SpanKind

from audit.tracing import memory_exporter, setup_tracing
from gateway.auditing import AuditHub
from gateway.record import RequestRecord

MARKS = ("t_auth", "t_parsed", "t_keys", "t_decided", "t_route", "t_end")
NAMES = ("authenticate", "parse", "prefix_keys", "policy", "route", "upstream")


@pytest.mark.parametrize("unset", [(), ("t_route",), ("t_keys", "t_decided"), ("t_auth",)])
def test_stage_children_follow_the_marks(unset: tuple[str, ...]) -> None:
    provider = setup_tracing("memory")
    hub = AuditHub(None, tracer=provider.get_tracer("t"))
    hub.provider = provider
    t0 = 1000.25
    rec = RequestRecord(request_id="r", endpoint="/v1/completions", client_addr=None, t0=t0)
    hub.start_span(rec, {})
    wall0 = rec.extra["wall0_ns"]
    times = {m: t0 + 0.001 * (i + 1) + 1.3e-7 * i for i, m in enumerate(MARKS)}
    for m, t in times.items():
        setattr(rec, m, None if m in unset else t)
    hub.emit_request(rec)
    spans = {s.name: s for s in memory_exporter().get_finished_spans()}
    marks = [t0] + [None if m in unset else times[m] for m in MARKS]
    for i, name in enumerate(NAMES):
        a, b = marks[i], marks[i + 1]
        if a is None or b is None:
            assert name not in spans
            continue
        s = spans[name]
        assert (s.start_time, s.end_time) == (wall0 + int((a - t0) * 1e9), wall0 + int((b - t0) * 1e9))
        assert s.kind == (SpanKind.CLIENT if name == "upstream" else SpanKind.INTERNAL)
    server = spans["POST /v1/completions"]
    assert server.end_time == wall0 + int((times["t_end"] - t0) * 1e9)
