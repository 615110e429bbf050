"""Session 10 (issues 14, 16): the audit worker POSTs its request spans itself (audit/span_post.py,
audit/worker_spans.py), no exporter child: batched, one POST per batch, the body byte for byte the
one the exporter child built for the same spans; retried per the OTLP spec; a down collector neither
blocks the producer nor grows the queue past its bound (drops counted); nothing outside the span
attributes' fields of the request row, so no prompt text, reaches the collector."""
from __future__ import annotations

import asyncio
import gzip
import random
from binascii import b2a_base64
from collections.abc import AsyncIterator
from typing import Any

import certifi
import orjson
import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry

from audit.otlp_trace_request import OtlpRequestEncoder
from audit.otlp_traces import OtlpHttpSettings
from audit.request_event import REQUEST_ROW_FIELDS
from audit.row_spans import SCOPE, row_span_bytes, row_span_record
from audit.span_post import SpanPoster, ssl_context
from audit.span_request import BYTES_MARK
from audit.tls import context_problems
from audit.worker_spans import WorkerSpans
from tests.audit.test_s9_otlp_pb import _row
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)

RESOURCE = Resource({"service.name": "pg-s10"})


class Stub:
    """An OTLP/HTTP traces collector: raw bodies kept; answers from ``script`` (status, headers, body) first."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []
        self.headers: list[dict[str, str]] = []
        self.script: list[tuple[int, dict[str, str], bytes]] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if request.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        self.headers.append(dict(request.headers))
        if self.script:
            status, headers, payload = self.script.pop(0)
            return web.Response(status=status, headers=headers, body=payload)
        self.bodies.append(body)
        return web.Response(body=ExportTraceServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    def spans(self) -> list[Any]:
        return [sp for b in self.bodies for rs in ExportTraceServiceRequest.FromString(b).resource_spans
                for ss in rs.scope_spans for sp in ss.spans]


@pytest.fixture
async def stub() -> AsyncIterator[tuple[Stub, str]]:
    col = Stub()
    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/traces", col.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield col, f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces"
    await runner.cleanup()


def _pairs(n: int, seed: int = 1) -> list[tuple[list[Any], list[Any]]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        extra = [rng.getrandbits(64) or 1, 1, 1_764_000_000_000_000_000 + i, None, None]
        out.append((orjson.loads(orjson.dumps(_row(rng, i))), extra))
    return out


def _poster(url: str, drops: dict[str, int], **kw: Any) -> SpanPoster:
    def drop(n: int, reason: str) -> None:
        drops[reason] = drops.get(reason, 0) + n

    settings = OtlpHttpSettings.resolve(url, {"Authorization": "Bearer t"}, kw.pop("timeout_s", 5.0), env={})
    return SpanPoster(RESOURCE, settings, drop, **kw)


async def test_spans_arrive_batched_and_byte_identical_to_the_childs_body(stub) -> None:
    col, url = stub
    drops: dict[str, int] = {}
    poster = _poster(url, drops, max_batch=50, flush_interval_s=0.05)
    poster.start()
    chunks = []
    for row, extra in _pairs(40):
        data, n = row_span_bytes(row, extra)
        chunks.append((data, n))
        poster.add_bytes(data, n, SCOPE)
    total = sum(n for _, n in chunks)
    await wait_for(lambda: len(col.spans()) >= total)
    await poster.close()
    assert len(col.spans()) == total and drops == {} and poster.exported == total
    # batched: far fewer POSTs than requests, none over max_batch spans, a request never split
    assert len(col.bodies) < len(chunks) / 3
    per_body = [sum(len(ss.spans) for rs in ExportTraceServiceRequest.FromString(b).resource_spans
                    for ss in rs.scope_spans) for b in col.bodies]
    assert max(per_body) <= 50
    # each body equals what the exporter child built from the base64 bytes records of the same spans
    ref = OtlpRequestEncoder(RESOURCE)
    i = 0
    for body, k in zip(col.bodies, per_body):
        records, got = [], 0
        while got < k:
            data, n = chunks[i]
            records.append(orjson.loads(orjson.dumps([BYTES_MARK, n, *SCOPE, b2a_base64(data, newline=False).decode()])))
            got, i = got + n, i + 1
        assert ref.encode(records) == (body, 0)
    assert all(h.get("Authorization") == "Bearer t" and h["Content-Type"] == "application/x-protobuf"
               for h in col.headers)


async def test_a_down_collector_neither_blocks_nor_grows_the_queue(unused_tcp_port: int) -> None:
    drops: dict[str, int] = {}
    url = f"http://127.0.0.1:{unused_tcp_port}/v1/traces"  # nobody listens
    retries: list[float] = []

    async def sleep(s: float) -> None:  # the retry waits, without waiting a second each
        retries.append(s)
        await asyncio.sleep(0.01)

    poster = _poster(url, drops, max_batch=64, max_queue_spans=500, flush_interval_s=0.02, timeout_s=30.0,
                     sleep=sleep)
    poster.start()
    data, n = row_span_bytes(*_pairs(1)[0])
    added = 0
    for _ in range(50):
        for _ in range(100):  # one event-loop turn's worth of requests, added without awaiting anything
            poster.add_bytes(data, n, SCOPE)
            added += n
            assert poster.queued_spans <= 500
        await asyncio.sleep(0.01)
    assert retries, "the connection failures are retried"
    assert drops.get("queue_full", 0) > 0 and sum(drops.values()) >= added - 500 - 64  # the rest queued / in flight
    await poster.close(timeout_s=0.5)
    assert sum(drops.values()) == added  # every span accounted for: none exported, all dropped and counted
    assert poster.queued_spans == 0 and poster.exported == 0


async def test_retryable_answers_are_retried_and_others_drop_the_batch(stub) -> None:
    col, url = stub
    drops: dict[str, int] = {}

    async def sleep(s: float) -> None:
        await asyncio.sleep(0)

    poster = _poster(url, drops, max_batch=1000, flush_interval_s=0.02, sleep=sleep)
    poster.start()
    data, n = row_span_bytes(*_pairs(1)[0])
    col.script = [(503, {"Retry-After": "0"}, b""), (429, {}, b"")]
    poster.add_bytes(data, n, SCOPE)
    await wait_for(lambda: len(col.bodies) == 1)
    assert poster.retries == 2 and drops == {}
    col.script = [(400, {}, b"bad")]  # not retryable (OTLP spec): the batch is dropped and counted
    poster.add_bytes(data, n, SCOPE)
    await wait_for(lambda: drops.get("export_failed") == n)
    assert len(col.bodies) == 1 and poster.retries == 2
    rejected = ExportTraceServiceResponse()
    rejected.partial_success.rejected_spans = 3
    col.script = [(200, {"Content-Type": "application/x-protobuf"}, rejected.SerializeToString())]
    poster.add_bytes(data, n, SCOPE)
    await wait_for(lambda: drops.get("rejected") == 3)
    await poster.close()


async def test_worker_spans_post_without_a_child_and_carry_no_prompt_text(stub) -> None:
    col, url = stub
    registry = CollectorRegistry()
    spans = WorkerSpans({"exporter": "otlp", "endpoint": url, "resource": {"service.name": "pg-s10"},
                         "resource_schema_url": None}, registry)
    assert spans.processor is None and spans.poster is not None  # no exporter child process
    secret = "SECRET-PROMPT-TEXT"
    exported = {"endpoint", "trace_id", "status_code", "model", "prompt_tokens", "output_tokens", "tenant",
                "replica", "predicted_prefix_tokens", "decision_id", "outcome"}
    pairs = _pairs(5)
    expected = sum(len(row_span_record(row, extra)[12]) + 1 for row, extra in pairs)
    for row, extra in pairs:
        for i, name in enumerate(REQUEST_ROW_FIELDS):  # every other text field holds prompt-like text
            if type(row[i]) is str and name not in exported:
                row[i] = secret
        spans.request(row, extra)
    # a request outside the plain bytes path (a link with a non-scalar attribute) goes as span records
    row, extra = _pairs(1, seed=7)[0]
    extra[3] = [[1, 2, 3, 1, True, {"k": [1, 2]}]]
    with pytest.raises(Exception):  # noqa: B017 -- any refusal of the plain bytes path
        row_span_bytes(row, extra)
    expected += len(row_span_record(row, extra)[12]) + 1
    spans.request(row, extra)
    spans.request([None] * 3, ["bad", 1, 2, None, None])  # malformed: refused, counted
    assert spans.refused == 1
    await wait_for(lambda: len(col.spans()) >= expected)
    await spans.close()
    assert not any(secret.encode() in b for b in col.bodies)
    assert len(col.spans()) == expected == spans.poster.exported and len(col.bodies) <= 2
    assert spans.dropped_by_reason == {}


async def test_an_unusable_endpoint_drops_and_counts(tmp_path) -> None:
    registry = CollectorRegistry()
    spans = WorkerSpans({"exporter": "otlp", "endpoint": "ftp://x/v1/traces", "resource": {}}, registry)
    row, extra = _pairs(1)[0]
    spans.request(row, extra)
    await spans.close()
    n = len(row_span_record(row, extra)[12]) + 1
    assert spans.dropped_by_reason == {"exporter_down": n}
    assert registry.get_sample_value("prefixgate_trace_spans_dropped_total", {"reason": "exporter_down"}) == n


def test_tls_settings_become_an_ssl_context() -> None:
    # S19-R3: no longer ``True`` (aiohttp's default, the interpreter's suites): the floor and suites of audit/tls.py
    plain = ssl_context(OtlpHttpSettings.resolve("https://c:4318/v1/traces", env={}))
    assert not isinstance(plain, bool) and context_problems(plain) == []
    settings = OtlpHttpSettings.resolve("https://c:4318/v1/traces",
                                        env={"OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": certifi.where()})
    ctx = ssl_context(settings)
    assert not isinstance(ctx, bool) and ctx.verify_mode.name == "CERT_REQUIRED" and ctx.get_ca_certs()
    with pytest.raises(OSError):
        ssl_context(OtlpHttpSettings.resolve("https://c/v1/traces", env={"OTEL_EXPORTER_OTLP_CERTIFICATE": "/nope"}))

