"""OffloadSpanProcessor -> child process -> real OTLPSpanExporter -> an
OTLP/HTTP collector (aiohttp on 127.0.0.1) that decodes
ExportTraceServiceRequest protobuf messages."""
from __future__ import annotations

import asyncio
import gzip
import os
import signal
import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest, ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, set_span_in_context
from prometheus_client import CollectorRegistry

from audit.span_export import OffloadSpanProcessor
from audit.span_frames import encode_frames, encode_span
from audit.span_exporter_proc import SpanDecoder
from audit.tracing import setup_tracing
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(30)

LINK_TRACE = 0x4BF92F3577B34DA6A3CE929D0E0E4736
LINK_SPAN = 0x00F067AA0BA902B7


class Collector:
    """Decoded spans as (resource attrs, scope name, pb Span)."""

    def __init__(self) -> None:
        self.spans: list[tuple[dict, str, PbSpan]] = []
        self.requests = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        msg = ExportTraceServiceRequest.FromString(body)
        self.requests += 1
        for rs in msg.resource_spans:
            res = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for sp in ss.spans:
                    self.spans.append((res, ss.scope.name, sp))
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def names(self) -> list[str]:
        return [s.name for _, _, s in self.spans]

    async def wait_for(self, pred, timeout: float = 8.0) -> None:
        deadline = time.monotonic() + timeout
        while not pred():
            if time.monotonic() > deadline:
                raise AssertionError(f"collector has {self.names()}")
            await asyncio.sleep(0.05)


@pytest.fixture
async def collector() -> AsyncIterator[tuple[Collector, str]]:
    col = Collector()
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/traces", col.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield col, f"http://127.0.0.1:{port}/v1/traces"
    await runner.cleanup()


def _provider(endpoint: str, **kw) -> tuple[TracerProvider, OffloadSpanProcessor]:
    resource = Resource.create({"service.name": "pg-offload-test"})
    proc = OffloadSpanProcessor("otlp", resource, endpoint=endpoint, timeout_s=2.0,
                                flush_interval_s=0.05, child_flush_interval_s=0.05, **kw)
    proc.start()
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(proc)
    return provider, proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); treat it as gone
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


async def test_server_and_child_span_arrive_with_structure(collector):
    col, url = collector
    provider, proc = _provider(url)
    tracer = provider.get_tracer("prefixgate.test", "1.2")
    link = Link(SpanContext(LINK_TRACE, LINK_SPAN, is_remote=True, trace_flags=TraceFlags(1)),
                attributes={"prefixgate.link": "client_traceparent"})
    try:
        server = tracer.start_span("POST /v1/chat/completions", kind=SpanKind.SERVER, links=[link],
                                   attributes={"http.route": "/v1/chat/completions", "prefixgate.tenant": "acme",
                                               "gen_ai.usage.input_tokens": 48, "x.ratio": 0.25,
                                               "x.flag": True, "x.list": ["a", "b"]})
        child = tracer.start_span("policy", context=set_span_in_context(server), kind=SpanKind.CLIENT,
                                  start_time=1_700_000_000_000_000_000)
        child.add_event("decided", {"allow": False}, timestamp=1_700_000_000_000_500_000)
        child.set_status(Status(StatusCode.ERROR, "denied"))
        child.end(end_time=1_700_000_000_001_000_000)
        server.end()
        await col.wait_for(lambda: len(col.spans) >= 2)
    finally:
        await asyncio.to_thread(provider.shutdown)
    by_name = {s.name: (res, scope, s) for res, scope, s in col.spans}
    res, scope, ps = by_name["POST /v1/chat/completions"]
    _, _, pc = by_name["policy"]
    sc = server.get_span_context()
    assert res["service.name"] == "pg-offload-test" and scope == "prefixgate.test"
    assert ps.trace_id == sc.trace_id.to_bytes(16, "big") == pc.trace_id
    assert ps.span_id == sc.span_id.to_bytes(8, "big") and ps.parent_span_id == b""
    assert pc.parent_span_id == ps.span_id
    assert ps.kind == PbSpan.SPAN_KIND_SERVER and pc.kind == PbSpan.SPAN_KIND_CLIENT
    assert (pc.start_time_unix_nano, pc.end_time_unix_nano) == (1_700_000_000_000_000_000, 1_700_000_000_001_000_000)
    attrs = {kv.key: kv.value for kv in ps.attributes}
    assert attrs["prefixgate.tenant"].string_value == "acme"
    assert attrs["gen_ai.usage.input_tokens"].int_value == 48
    assert attrs["x.ratio"].double_value == 0.25 and attrs["x.flag"].bool_value is True
    assert [v.string_value for v in attrs["x.list"].array_value.values] == ["a", "b"]
    (pl,) = ps.links
    assert pl.trace_id == LINK_TRACE.to_bytes(16, "big") and pl.span_id == LINK_SPAN.to_bytes(8, "big")
    assert pl.attributes[0].key == "prefixgate.link" and pl.attributes[0].value.string_value == "client_traceparent"
    assert pc.status.code == 2 and pc.status.message == "denied"  # STATUS_CODE_ERROR
    (ev,) = pc.events
    assert ev.name == "decided" and ev.time_unix_nano == 1_700_000_000_000_500_000
    assert ev.attributes[0].value.bool_value is False
    assert proc.dropped == 0


def test_roundtrip_matches_sdk_encoding():
    """The child's rebuilt span encodes to the same protobuf as the original."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    import orjson

    resource = Resource.create({"service.name": "rt"})
    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(mem))
    tracer = provider.get_tracer("t", "0.1", schema_url="https://opentelemetry.io/schemas/1.21.0")
    s = tracer.start_span("a", attributes={"b": b"\x00\xff", "i": -5, "f": [1.5, 2.5]},
                          links=[Link(SpanContext(LINK_TRACE, LINK_SPAN, is_remote=True), {"k": "v"})])
    s.add_event("e", {"n": 1})
    s.set_status(Status(StatusCode.OK))
    s.end()
    (orig,) = mem.get_finished_spans()
    data, bad = encode_frames([encode_span(orig)], 512)
    assert bad == 0 and data.endswith(b"\n")
    (rebuilt,) = SpanDecoder(resource).decode_frame(data.rstrip(b"\n"))
    assert encode_spans([rebuilt]).SerializeToString() == encode_spans([orig]).SerializeToString()
    assert orjson.loads(data)[0][0] == "a"


def test_unencodable_span_is_dropped_alone():
    resource = Resource.create({})
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    mem = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(mem))
    tracer = provider.get_tracer("t")
    tracer.start_span("big", attributes={"n": 1 << 70}).end()
    tracer.start_span("ok", attributes={"n": 1}).end()
    data, bad = encode_frames([encode_span(s) for s in mem.get_finished_spans()], 512)
    assert bad == 1
    assert [s.name for s in SpanDecoder(resource).decode_frame(data.rstrip(b"\n"))] == ["ok"]


async def test_several_flushes_arrive_and_shutdown_reaps_child(collector):
    col, url = collector
    provider, proc = _provider(url, max_batch=8)
    tracer = provider.get_tracer("t")
    pid = proc.child_pid
    assert pid is not None and _alive(pid)
    for round_ in range(3):
        for i in range(20):
            tracer.start_span(f"r{round_}-{i}").end()
        await col.wait_for(lambda: len(col.spans) >= 20 * (round_ + 1))
    for i in range(50):  # these are still queued when shutdown starts
        tracer.start_span(f"tail-{i}").end()
    await asyncio.to_thread(provider.shutdown)
    await col.wait_for(lambda: len(col.spans) >= 110, timeout=2.0)
    assert sorted(col.names()) == sorted([f"r{r}-{i}" for r in range(3) for i in range(20)]
                                         + [f"tail-{i}" for i in range(50)])
    assert col.requests >= 4  # batches of <= 8 spans: several exports, not one
    assert not _alive(pid) and proc.child_pid is None and proc.dropped == 0


async def test_killed_child_is_restarted_and_gap_counted(collector):
    col, url = collector
    registry = CollectorRegistry()
    provider, proc = _provider(url, registry=registry, restart_backoff_s=(0.6, 1.0))
    tracer = provider.get_tracer("t")
    try:
        tracer.start_span("before").end()
        await col.wait_for(lambda: "before" in col.names())
        old = proc.child_pid
        os.kill(old, signal.SIGKILL)
        # the writer notices the death; the restart waits for the 0.6 s backoff
        await wait_for(lambda: proc.child_pid is None, what="the writer to notice the dead child")
        for i in range(5):
            tracer.start_span(f"gap-{i}").end()
        await wait_for(lambda: proc.child_pid not in (None, old), what="the child restarted")
        assert proc.restarts == 1
        tracer.start_span("after").end()
        await col.wait_for(lambda: "after" in col.names())
    finally:
        await asyncio.to_thread(provider.shutdown)
    assert not any(n.startswith("gap-") for n in col.names())
    assert proc.dropped_by_reason == {"exporter_down": 5}
    assert registry.get_sample_value("prefixgate_trace_spans_dropped_total", {"reason": "exporter_down"}) == 5
    assert not _alive(old)


async def test_full_queue_drops_and_counts_without_blocking(collector):
    col, url = collector
    registry = CollectorRegistry()
    provider, proc = _provider(url, registry=registry, max_queue_spans=100)
    tracer = provider.get_tracer("t")
    try:
        os.kill(proc.child_pid, signal.SIGSTOP)  # a child that stops reading: the pipe fills up
        proc._wake.set()
        big = "x" * 1000
        for i in range(3000):  # ~3 MB: more than the 1 MiB pipe + 100 queued spans
            tracer.start_span(f"s{i}", attributes={"pad": big}).end()
        dropped = proc.dropped_by_reason.get("queue_full", 0)
        assert dropped > 0
        assert registry.get_sample_value("prefixgate_trace_spans_dropped_total", {"reason": "queue_full"}) == dropped
    finally:
        pid = proc.child_pid
        os.kill(pid, signal.SIGCONT)
        await asyncio.to_thread(provider.shutdown)
    assert not _alive(pid)
    received = len(col.spans)
    assert received + proc.dropped == 3000  # every span either arrived or was counted


async def test_child_ignores_sigterm_and_exits_on_eof(collector):
    col, url = collector
    provider, proc = _provider(url)
    pid = proc.child_pid
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGINT)
    provider.get_tracer("t").start_span("still-here").end()
    await col.wait_for(lambda: "still-here" in col.names())
    assert _alive(pid) and proc.restarts == 0
    await asyncio.to_thread(provider.shutdown)
    assert not _alive(pid)


async def test_setup_tracing_offloads_otlp(collector):
    col, url = collector
    provider = setup_tracing("otlp", "pg-setup", endpoint=url, offload=True)
    (proc,) = provider._active_span_processor._span_processors
    assert isinstance(proc, OffloadSpanProcessor)
    provider.get_tracer("t").start_span("via-setup").end()
    await asyncio.to_thread(provider.shutdown)
    await col.wait_for(lambda: "via-setup" in col.names(), timeout=3.0)
    assert col.spans[0][0]["service.name"] == "pg-setup"


def test_console_exporter_runs_in_child(capfd):
    resource = Resource.create({"service.name": "pg-console"})
    proc = OffloadSpanProcessor("console", resource, flush_interval_s=0.05, child_flush_interval_s=0.05)
    proc.start()
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    provider.add_span_processor(proc)
    provider.get_tracer("t").start_span("console-span", attributes={"k": 7}).end()
    pid = proc.child_pid
    provider.shutdown()
    out = capfd.readouterr().out  # the child inherits fd 1; ConsoleSpanExporter writes JSON there
    assert '"name": "console-span"' in out and '"service.name": "pg-console"' in out and '"k": 7' in out
    assert pid != os.getpid() and not _alive(pid)


def test_unknown_exporter_kind_rejected():
    from audit.span_export import SpanExportConfigError
    with pytest.raises(SpanExportConfigError):
        OffloadSpanProcessor("memory", Resource.create({}))


# -- OTLP fast path: wire records -> ExportTraceServiceRequest without ReadableSpan --------------

def _rich_spans() -> tuple[Resource, list]:
    """Spans covering every encoded feature: bytes / list / float / bool attributes, links with
    attributes (remote and local), events, error + OK status, trace_state, a remote parent,
    dropped counts, three scopes (one with a schema URL) interleaved, and a span with no scope."""
    from opentelemetry.sdk.trace import SpanLimits
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import NonRecordingSpan, TraceState

    resource = Resource.create({"service.name": "fast", "host.ids": ["a", "b"], "k8s.n": 3}, "https://s/1")
    mem = InMemorySpanExporter()
    provider = TracerProvider(resource=resource, shutdown_on_exit=False,
                              span_limits=SpanLimits(max_span_attributes=6, max_events=2, max_links=2))
    provider.add_span_processor(SimpleSpanProcessor(mem))
    t_a = provider.get_tracer("scope.a", "1.0", schema_url="https://opentelemetry.io/schemas/1.21.0")
    t_b = provider.get_tracer("scope.b")
    remote_parent = set_span_in_context(NonRecordingSpan(SpanContext(
        LINK_TRACE, 0x1111, is_remote=True, trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "v1"), ("pg", "a-b")]))))
    s = t_a.start_span("root", context=remote_parent, kind=SpanKind.SERVER,
                       attributes={"b": b"\x00\xff", "i": -5, "f": [1.5, 2.5], "t": True,
                                   "s": ["x", "y"], "big": (1 << 63) - 1, "extra": 1, "extra2": 2},
                       links=[Link(SpanContext(LINK_TRACE, LINK_SPAN, is_remote=True), {"k": "v", "n": [1, 2]}),
                              Link(SpanContext(LINK_TRACE, 0x22, is_remote=False)),
                              Link(SpanContext(LINK_TRACE, 0x33, is_remote=True))])
    for i in range(3):
        s.add_event(f"e{i}", {"n": i, "flag": False}, timestamp=1_700_000_000_000_000_000 + i)
    s.set_status(Status(StatusCode.ERROR, "upstream 503"))
    s.end()
    c = t_b.start_span("child", context=set_span_in_context(s), kind=SpanKind.CLIENT, start_time=10)
    c.set_status(Status(StatusCode.OK))
    c.end(end_time=20)
    t_a.start_span("a-again", attributes={"empty": []}).end()
    provider.get_tracer("").start_span("blank-scope").end()
    t_c = provider.get_tracer("scope.c", "2")
    t_c.start_span("c", kind=SpanKind.PRODUCER).end()
    t_b.start_span("b-again", kind=SpanKind.CONSUMER).end()
    return resource, list(mem.get_finished_spans())


def _wire_records(spans) -> list[list]:
    import orjson
    data, bad = encode_frames([encode_span(s) for s in spans], 512)
    assert bad == 0
    return orjson.loads(data)


def test_fast_encoder_bytes_equal_sdk_encoder():
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from audit.span_exporter_proc import OtlpRequestEncoder

    resource, spans = _rich_spans()
    assert spans[0].dropped_attributes == 2 and spans[0].dropped_events == 1 and spans[0].dropped_links == 1
    records = _wire_records(spans)
    body, bad = OtlpRequestEncoder(resource).encode(records)
    rebuilt = SpanDecoder(resource).decode_frame(encode_frames([encode_span(s) for s in spans], 512)[0].rstrip(b"\n"))
    assert bad == 0
    assert body == encode_spans(rebuilt).SerializeToString() == encode_spans(spans).SerializeToString()
    msg = ExportTraceServiceRequest.FromString(body)
    (rs,) = msg.resource_spans
    assert [ss.scope.name for ss in rs.scope_spans] == ["scope.a", "scope.b", "", "scope.c"]
    root = rs.scope_spans[0].spans[0]
    assert root.trace_state == "vendor=v1,pg=a-b" and root.flags == 0x300 and root.status.code == 2
    assert [lk.flags for lk in root.links] == [0x100, 0x300]  # oldest link dropped and root.dropped_links_count == 1
    # each span alone too (single-scope batches, and the no-scope case)
    for s in spans:
        body, bad = OtlpRequestEncoder(resource).encode(_wire_records([s]))
        assert bad == 0 and body == encode_spans([s]).SerializeToString(), s.name


def test_fast_encoder_leaves_out_bad_records_only():
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from audit.span_exporter_proc import OtlpRequestEncoder

    resource, spans = _rich_spans()
    records = _wire_records(spans)
    bad_kind = list(records[1]); bad_kind[8] = 99          # unknown SpanKind
    bad_attr = list(records[4]); bad_attr[11] = {"x": {"nested": 1}}  # not a wire value
    bad_name = list(records[5]); bad_name[0] = 12          # name not a string
    body, bad = OtlpRequestEncoder(resource).encode(
        [records[0], bad_kind, records[2], records[3], bad_attr, bad_name])
    assert bad == 3
    assert body == encode_spans([spans[0], spans[2], spans[3]]).SerializeToString()
    assert OtlpRequestEncoder(resource).encode([bad_kind]) == (b"", 1)


def test_parse_records_rejects_wrong_shapes():
    from audit.span_exporter_proc import FrameError, parse_records

    assert parse_records(b"[]") == []
    for line in (b"{", b'{"a": 1}', b"[[1, 2]]", b"[1]"):
        with pytest.raises(FrameError):
            parse_records(line)


def test_pipeline_choice():
    from audit.span_exporter_proc import build_pipeline

    cfg = {"exporter": "otlp", "endpoint": "http://127.0.0.1:9/v1/traces", "resource": {"service.name": "p"}}
    otlp = build_pipeline(cfg, env={})
    console = build_pipeline({**cfg, "exporter": "console"}, env={})
    try:
        assert otlp.parse(b"[]") == [] and otlp.export([]).name == "SUCCESS"
        assert console.parse(b"[]") == []
    finally:
        for p in (otlp, console):
            p.shutdown()
    with pytest.raises(ValueError):
        build_pipeline({"exporter": "zipkin"}, env={})


async def test_child_posts_sdk_identical_bodies(monkeypatch):
    """End to end through the child, gzip on: the child POSTs the SDK encoder's protobuf
    (after gunzip) with the configured headers and Content-Encoding."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    bodies: list[bytes] = []
    seen_headers: list[dict] = []

    async def handle(request: web.Request) -> web.Response:
        raw = await request.read()
        seen_headers.append(dict(request.headers))
        bodies.append(raw)  # aiohttp inflates Content-Encoding: gzip itself
        return web.Response(body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_post("/v1/traces", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces"
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
    resource, spans = _rich_spans()
    proc = OffloadSpanProcessor("otlp", resource, endpoint=url, headers={"x-tenant-token": "t0k"},
                                timeout_s=2.0, flush_interval_s=0.05, child_flush_interval_s=0.05)
    try:
        proc.start()
        for s in spans:
            proc.on_end(s)
        deadline = time.monotonic() + 8
        while not bodies and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    finally:
        await asyncio.to_thread(proc.shutdown)
        await runner.cleanup()
    assert bodies == [encode_spans(spans).SerializeToString()]
    assert seen_headers[0]["Content-Encoding"] == "gzip" and seen_headers[0]["x-tenant-token"] == "t0k"
    assert seen_headers[0]["Content-Type"] == "application/x-protobuf"
    assert proc.dropped == 0
