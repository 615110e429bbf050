"""Session 7 (issue 14): a request's encoded spans reach the offload processor in one call
(``on_end_encoded_many``), with the queue bound, drop counting and early wake of one call per span."""
from __future__ import annotations

from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanKind

from audit import tracing
from audit.span_export import DROP_QUEUE_FULL, OffloadSpanProcessor


def _proc(max_queue: int, max_batch: int = 512) -> OffloadSpanProcessor:
    return OffloadSpanProcessor("otlp", Resource({}), endpoint="http://127.0.0.1:9/v1/traces",
                                max_queue_spans=max_queue, max_batch=max_batch)  # never started: no child


def _spans(tag: str, n: int) -> list[tuple]:
    return [(f"{tag}{i}",) for i in range(n)]


def test_many_queues_like_one_by_one_and_drops_past_the_bound() -> None:
    one, many = _proc(10), _proc(10)
    for batch in (_spans("a", 7), _spans("b", 7), _spans("c", 2)):
        for s in batch:
            one.on_end_encoded(s)
        many.on_end_encoded_many(batch)
    assert list(many._queue) == list(one._queue) == _spans("a", 7) + _spans("b", 3)  # noqa: SLF001
    assert many.dropped_by_reason == one.dropped_by_reason == {DROP_QUEUE_FULL: 6}


def test_many_wakes_the_writer_when_a_batch_is_full() -> None:
    p = _proc(100, max_batch=10)
    p.on_end_encoded_many(_spans("a", 7))
    assert not p._wake.is_set()  # noqa: SLF001
    p.on_end_encoded_many(_spans("b", 7))
    assert p._wake.is_set()  # noqa: SLF001


def test_end_request_trace_hands_a_request_over_in_one_call() -> None:
    calls: list[Any] = []

    class _Many:
        takes_encoded = True

        def on_end_encoded(self, one: tuple) -> None:
            calls.append(("one", one))

        def on_end_encoded_many(self, spans: list[tuple]) -> None:
            calls.append(("many", list(spans)))

    provider = tracing.setup_tracing("memory")
    tracing._PROCESSORS[provider][:] = [_Many()]  # noqa: SLF001
    rt = tracing.begin_request_trace(provider, "POST /v1/completions", [], {"http.route": "/v1/completions"}, 1000)
    assert rt is not None
    n = tracing.end_request_trace(rt, 2000, {"x": 1}, False, [("parse", SpanKind.INTERNAL, 1100, 1200),
                                                             ("upstream", SpanKind.CLIENT, 1200, 1900)])
    assert n == 3 and [c[0] for c in calls] == ["many"] and len(calls[0][1]) == 3
