"""Session 6 (issue 14): :func:`audit.tracing.begin_request_trace` decides the sampling of
``setup_tracing``'s two samplers itself (no ``SamplingResult`` per request): the same decision as
the sampler's own ``should_sample`` for every trace id, and a root's empty trace state even when
some live span is current (the server span is a new root: nothing is inherited from a context)."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from audit.tracing import begin_request_trace, setup_tracing


def test_ratio_sampling_is_the_samplers_own_decision() -> None:
    provider = setup_tracing("memory", sample_ratio=0.5)
    sampled = 0
    for _ in range(400):
        rt = begin_request_trace(provider, "POST /v1/completions", [], {})
        assert rt is not None
        want = provider.sampler.should_sample(None, rt.context.trace_id, "POST /v1/completions").decision
        assert rt.context.trace_flags.sampled == want.is_sampled()
        sampled += rt.context.trace_flags.sampled
    assert 100 < sampled < 300  # both outcomes happen
    never = setup_tracing("memory", sample_ratio=0.0)
    assert not any(begin_request_trace(never, "x", [], {}).context.trace_flags.sampled for _ in range(50))


def test_a_root_inherits_no_trace_state_from_a_current_span() -> None:
    provider = setup_tracing("memory")
    other = SpanContext(0x1234, 0x99, False, TraceFlags(TraceFlags.SAMPLED), TraceState([("vendor", "secret")]))
    with trace.use_span(NonRecordingSpan(other)):
        rt = begin_request_trace(provider, "POST /v1/completions", [], {})
    assert rt is not None and rt.context.trace_flags.sampled
    assert not rt.context.trace_state  # before session 6: the current span's ("vendor", "secret")
    assert rt.context.trace_id != 0x1234
