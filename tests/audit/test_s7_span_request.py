"""Session 7 (issue 14): the gateway hands the span exporter child one compact record per request
(:mod:`audit.span_request`); the child expands it into the same span records the gateway used to
encode (children ids now made in the child), so the OTLP request keeps its structure."""
from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import Link, SpanContext, SpanKind, TraceFlags, TraceState

import audit.tracing as tracing
from audit.otlp_trace_request import FrameError, check_records
from audit.span_export import DROP_QUEUE_FULL, OffloadSpanProcessor
from audit.span_frames import encode_frames, encode_request_spans
from audit.span_request import encode_request_record, expand_request_record, span_count
from tests.audit.test_span_offload import collector  # noqa: F401 -- fixture

VALUES = st.one_of(st.text(max_size=5), st.integers(-3, 10**12), st.booleans(), st.floats(allow_nan=False))
ATTRS = st.dictionaries(st.sampled_from(["a", "b", "gen_ai.x", "prefixgate.y"]), VALUES, max_size=4)
CHILDREN = st.lists(st.tuples(st.sampled_from(["authenticate", "parse", "upstream"]),
                              st.sampled_from([SpanKind.INTERNAL, SpanKind.CLIENT]),
                              st.integers(0, 10**18), st.integers(0, 10**18)), max_size=6)


def _wire(x: Any) -> Any:
    return orjson.loads(orjson.dumps(x))


def _ids(start: int):
    n = [start]

    def new() -> int:
        n[0] += 1
        return n[0]
    return new


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(1, 2**40), attrs=ATTRS, error=st.booleans(), children=CHILDREN,
       link=st.one_of(st.none(), ATTRS), state=st.sampled_from([None, TraceState([("v", "1"), ("w", "x")])]),
       flags=st.sampled_from([0, 1]), end=st.integers(0, 10**18))
def test_expanded_request_record_is_the_spans_the_gateway_encoded(seed, attrs, error, children, link, state, flags,
                                                                  end) -> None:
    ctx = SpanContext((seed << 70) | 0xABC, seed * 3 + 1, False, TraceFlags(flags), state)
    links = [] if link is None else [Link(SpanContext(7 << 80, 9, True, TraceFlags(1)), attributes=link)]
    scope = tracing._SCOPE  # noqa: SLF001
    old = encode_request_spans("POST /v1/completions", ctx, links, dict(attrs), 1234, end, error, children,
                               _ids(seed), scope)
    rec = encode_request_record("POST /v1/completions", ctx, links, dict(attrs), 1234, end, error, children, scope)
    assert span_count(rec) == len(children) + 1
    assert expand_request_record(_wire(rec), _ids(seed)) == _wire(old)


def test_check_records_expands_request_records_and_rejects_bad_children() -> None:
    ctx = SpanContext(5 << 64 | 6, 77, False, TraceFlags(1))
    rec = encode_request_record("POST /x", ctx, [], {"k": 1}, 10, 20, False,
                                [("parse", SpanKind.INTERNAL, 11, 12), ("upstream", SpanKind.CLIENT, 12, 19)], None)
    single = list(_wire(encode_request_spans("one", ctx, [], {}, 1, 2, False, [], lambda: 1, None))[0])
    got = check_records(_wire([single, rec]))
    assert [r[0] for r in got] == ["one", "parse", "upstream", "POST /x"]
    assert got[1][6] == got[2][6] == 77 and got[1][3] not in (0, 77, got[2][3]) and got[2][3] != 0
    bad = _wire(rec)
    bad[12][0][1] = 99  # no such SpanKind
    with pytest.raises(FrameError):
        check_records([bad])


def _proc(max_queue: int, max_batch: int = 512) -> OffloadSpanProcessor:
    return OffloadSpanProcessor("otlp", Resource({}), endpoint="http://127.0.0.1:9/v1/traces",
                                max_queue_spans=max_queue, max_batch=max_batch)  # never started: no child


def _rec(n_children: int) -> tuple:
    ctx = SpanContext(1 << 64 | 2, 3, False, TraceFlags(1))
    return encode_request_record("POST /x", ctx, [], {}, 1, 2, False,
                                 [("c", SpanKind.INTERNAL, 1, 2)] * n_children, None)


def test_request_records_count_their_spans_against_the_bound_and_wake() -> None:
    p = _proc(16, max_batch=10)
    p.on_end_request(_rec(6))  # 7 spans
    assert not p._wake.is_set()  # noqa: SLF001
    p.on_end_request(_rec(6))  # 14 spans: a batch is queued
    assert p._wake.is_set()  # noqa: SLF001
    p.on_end_request(_rec(6))  # 21 > 16: the whole request dropped, its 7 spans counted
    p.on_end_encoded(("x",))
    p.on_end_encoded(("y",))
    p.on_end_encoded(("z",))  # 17th span: over the bound
    assert len(p._queue) == 4 and p.dropped_by_reason == {DROP_QUEUE_FULL: 8}  # noqa: SLF001


def test_an_unencodable_request_record_counts_all_its_spans() -> None:
    rec = _rec(2)
    bad = rec[:9] + ({"big": 1 << 70},) + rec[10:]
    data, n_bad = encode_frames([_rec(1), bad], 512, span_count)  # as the exporter calls it
    assert n_bad == 3 and len(orjson.loads(data)) == 1


def test_end_request_trace_hands_one_record_and_draws_no_child_ids() -> None:
    provider = tracing.setup_tracing("memory")
    drawn = []
    real = provider.id_generator

    class Ids:
        def generate_trace_id(self) -> int:
            return real.generate_trace_id()

        def generate_span_id(self) -> int:
            drawn.append(1)
            return real.generate_span_id()

    provider.id_generator = Ids()  # type: ignore[misc]
    got: list[tuple] = []

    class Cap:
        takes_encoded = True

        def on_end_request(self, rec: tuple) -> None:
            got.append(rec)

    tracing._PROCESSORS[provider][:] = [Cap()]  # noqa: SLF001
    rt = tracing.begin_request_trace(provider, "POST /v1/completions", [], {"http.route": "/v1/completions"}, 1000)
    n = tracing.end_request_trace(rt, 2000, {"x": 1}, False, [("parse", SpanKind.INTERNAL, 1100, 1200),
                                                             ("upstream", SpanKind.CLIENT, 1200, 1900)])
    assert n == 3 and len(got) == 1 and len(drawn) == 1  # the server span's id only
    assert expand_request_record(_wire(got[0]))[-1][11] == {"http.route": "/v1/completions", "x": 1}


async def test_request_record_reaches_the_collector_as_seven_spans(collector) -> None:  # noqa: F811
    col, url = collector
    proc = OffloadSpanProcessor("otlp", Resource.create({"service.name": "t"}), endpoint=url, timeout_s=2.0,
                                flush_interval_s=0.05, child_flush_interval_s=0.05)
    proc.start()
    names = ["authenticate", "parse", "prefix_keys", "policy", "route", "upstream"]
    ctx = SpanContext(0xABCDEF << 64 | 0x1234, 0x55AA, False, TraceFlags(1))
    children = [(n, SpanKind.CLIENT if n == "upstream" else SpanKind.INTERNAL, 100 + i, 101 + i)
                for i, n in enumerate(names)]
    try:
        proc.on_end_request(encode_request_record("POST /v1/completions", ctx, [], {"prefixgate.tenant": "a"},
                                                  100, 200, True, children, tracing._SCOPE))  # noqa: SLF001
        await col.wait_for(lambda: len(col.spans) >= 7)
    finally:
        await asyncio.to_thread(proc.shutdown)
    spans = {s.name: s for _, _, s in col.spans}
    server = spans["POST /v1/completions"]
    assert server.span_id == (0x55AA).to_bytes(8, "big") and server.parent_span_id == b""
    assert server.status.code == 2 and server.kind == 2  # ERROR, SERVER
    ids = {spans[n].span_id for n in names}
    assert len(ids) == 6 and server.span_id not in ids and b"\0" * 8 not in ids
    assert all(spans[n].parent_span_id == server.span_id and spans[n].trace_id == server.trace_id for n in names)
    assert spans["upstream"].kind == 3 and spans["parse"].kind == 1  # CLIENT, INTERNAL
    assert proc.dropped == 0 and {col_scope for _, col_scope, _ in col.spans} == {"prefixgate"}
