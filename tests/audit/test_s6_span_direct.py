"""Session 6 (issue 14): :func:`audit.tracing.end_request_trace` hands the offload span processor
its spans already encoded (:func:`audit.span_frames.encode_request_spans`), without building SDK
spans. Property: for random requests the tuples are exactly ``encode_span`` of the ReadableSpans
the SDK path builds (same ids, fields, attributes, links, status), so the exporter child receives
the same frames."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState

import audit.tracing as tracing
from audit.span_export import OffloadSpanProcessor
from audit.span_frames import encode_span


class _Ids:
    def __init__(self, start: int) -> None:
        self.n = start

    def generate_span_id(self) -> int:
        self.n += 1
        return self.n

    def generate_trace_id(self) -> int:
        self.n += 1
        return (self.n << 70) | 0xABC


class _Capture:
    def __init__(self, encoded: bool) -> None:
        self.takes_encoded = encoded
        self.got: list[tuple] = []

    def on_end(self, span: Any) -> None:
        self.got.append(encode_span(span))

    def on_end_encoded(self, one: tuple) -> None:
        self.got.append(one)


VALUES = st.one_of(st.text(max_size=5), st.integers(-3, 10**12), st.booleans(), st.floats(allow_nan=False))
ATTRS = st.dictionaries(st.sampled_from(["a", "b", "gen_ai.x", "prefixgate.y"]), VALUES, max_size=4)
CHILDREN = st.lists(st.tuples(st.sampled_from(["authenticate", "parse", "upstream"]),
                              st.sampled_from([SpanKind.INTERNAL, SpanKind.CLIENT]),
                              st.integers(0, 10**18), st.integers(0, 10**18)), max_size=6)


def _ended(encoded: bool, seed: int, links: list[Link], start_attrs: dict[str, Any], attrs: dict[str, Any],
           error: bool, children: list[Any], state: TraceState | None, name: str) -> list[tuple]:
    provider = tracing.setup_tracing("memory")
    provider.id_generator = _Ids(seed)  # type: ignore[misc]
    cap = _Capture(encoded)
    tracing._PROCESSORS[provider][:] = [cap]  # noqa: SLF001
    rt = tracing.begin_request_trace(provider, name, links, dict(start_attrs), 1234)
    assert rt is not None
    if state is not None:
        ctx = rt.context
        rt.context = SpanContext(ctx.trace_id, ctx.span_id, False, ctx.trace_flags, state)
    n = tracing.end_request_trace(rt, 99999, attrs, error, children)
    assert n == len(cap.got) == len(children) + 1
    return cap.got


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**40), start_attrs=ATTRS, attrs=ATTRS, error=st.booleans(), children=CHILDREN,
       link=st.one_of(st.none(), ATTRS), state=st.sampled_from([None, TraceState([("v", "1"), ("w", "x")])]),
       name=st.sampled_from(["POST /v1/completions", "POST /v1/chat/completions"]))
def test_direct_encoding_is_encode_span_of_the_sdk_spans(seed: int, start_attrs: dict[str, Any],
                                                          attrs: dict[str, Any], error: bool, children: list[Any],
                                                          link: dict[str, Any] | None, state: TraceState | None,
                                                          name: str) -> None:
    links = [] if link is None else [Link(SpanContext(7 << 80, 9, True, TraceFlags(1)), attributes=link)]
    sdk = _ended(False, seed, links, start_attrs, attrs, error, children, state, name)
    direct = _ended(True, seed, links, start_attrs, attrs, error, children, state, name)
    assert direct == sdk


def test_the_offload_processor_takes_encoded_spans() -> None:
    assert OffloadSpanProcessor.takes_encoded is True and callable(OffloadSpanProcessor.on_end_encoded)
