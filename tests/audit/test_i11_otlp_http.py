"""Issue 11 item 5: the span exporter child exports OTLP/HTTP on public APIs
only (its own encoder and HTTP client, no private attributes of the SDK's
OTLPSpanExporter), following the OTLP/HTTP spec: protobuf content type,
retries on 429/502/503/504 with backoff and Retry-After, no retry otherwise,
partial success counted."""
from __future__ import annotations

import asyncio
import pathlib
import subprocess
import sys
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from audit.otlp_traces import DEFAULT_ENDPOINT, OtlpHttpSender, OtlpHttpSettings

pytestmark = pytest.mark.timeout(30)

REPO = pathlib.Path(__file__).resolve().parents[2]
BODY = ExportTraceServiceRequest().SerializeToString() + b"\n\x00"  # any bytes do for the transport


class Script:
    """A collector that answers from a script of (status, headers, body) and records requests."""

    def __init__(self, answers: list[tuple[int, dict[str, str], bytes]]) -> None:
        self.answers = answers
        self.requests: list[tuple[dict[str, str], bytes]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), await request.read()))
        status, headers, body = self.answers[min(len(self.requests), len(self.answers)) - 1]
        return web.Response(status=status, headers=headers, body=body)


@pytest.fixture
async def serve() -> AsyncIterator[Callable]:
    runners: list[web.AppRunner] = []

    async def start(script: Script) -> str:
        app = web.Application()
        app.router.add_post("/v1/traces", script.handle)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/v1/traces"

    yield start
    for r in runners:
        await r.cleanup()


def _sender(url: str, delays: list[float] | None = None, timeout_s: float = 5.0, **kw) -> OtlpHttpSender:
    def sleep(d: float) -> bool:
        if delays is not None:
            delays.append(d)
        return False

    return OtlpHttpSender(OtlpHttpSettings.resolve(url, kw.pop("headers", None), timeout_s, env={}),
                          sleep=sleep, **kw)


async def test_retryable_statuses_are_retried_then_succeed(serve) -> None:
    for status in (429, 502, 503, 504):
        script = Script([(status, {}, b""), (status, {}, b""), (200, {}, b"")])
        delays: list[float] = []
        s = _sender(await serve(script), delays)
        assert await asyncio.to_thread(s.export, BODY)
        assert len(script.requests) == 3 and s.retries == 2 and s.requests == 1
        assert 0.8 <= delays[0] <= 1.2 and 1.6 <= delays[1] <= 2.4  # doubling, jittered
        headers, body = script.requests[0]
        assert headers["Content-Type"] == "application/x-protobuf" and body == BODY


async def test_retry_after_seconds_is_honoured(serve) -> None:
    script = Script([(503, {"Retry-After": "0"}, b""), (200, {}, b"")])
    delays: list[float] = []
    s = _sender(await serve(script), delays)
    assert await asyncio.to_thread(s.export, BODY)
    assert delays == [0.0] and len(script.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 500, 501])
async def test_other_statuses_are_not_retried(serve, status: int) -> None:
    script = Script([(status, {}, b""), (200, {}, b"")])
    s = _sender(await serve(script), [])
    assert not await asyncio.to_thread(s.export, BODY)
    assert len(script.requests) == 1 and s.retries == 0


async def test_redirect_is_not_followed_nor_success(serve) -> None:
    script = Script([(307, {"Location": "http://127.0.0.1:9/x"}, b"")])
    s = _sender(await serve(script), [])
    assert not await asyncio.to_thread(s.export, BODY)
    assert len(script.requests) == 1


async def test_retries_stop_when_the_timeout_is_spent(serve) -> None:
    script = Script([(503, {}, b"")])
    s = _sender(await serve(script), [], timeout_s=0.5)  # first backoff (>= 0.8 s) exceeds the budget
    assert not await asyncio.to_thread(s.export, BODY)
    assert len(script.requests) == 1


def test_connection_failure_is_retryable_within_the_budget() -> None:
    delays: list[float] = []
    s = _sender("http://127.0.0.1:9/v1/traces", delays, timeout_s=1.5)
    assert not s.export(BODY)
    assert 1 <= len(delays) <= 2 and 0.8 <= delays[0] <= 1.2


async def test_partial_success_is_counted_not_retried(serve) -> None:
    answer = ExportTraceServiceResponse()
    answer.partial_success.rejected_spans = 3
    answer.partial_success.error_message = "too old"
    script = Script([(200, {"Content-Type": "application/x-protobuf"}, answer.SerializeToString())])
    s = _sender(await serve(script), [])
    assert await asyncio.to_thread(s.export, BODY)
    assert s.rejected_spans == 3 and len(script.requests) == 1


async def test_gzip_and_headers(serve) -> None:
    script = Script([(200, {}, b"")])
    url = await serve(script)
    settings = OtlpHttpSettings.resolve(url, {"Authorization": "Bearer x", "Content-Type": "text/plain"}, 2.0,
                                        env={"OTEL_EXPORTER_OTLP_COMPRESSION": "gzip"})
    s = OtlpHttpSender(settings)
    assert await asyncio.to_thread(s.export, BODY)
    headers, body = script.requests[0]
    assert body == BODY  # aiohttp inflates gzip
    assert headers["Content-Encoding"] == "gzip" and headers["Authorization"] == "Bearer x"
    assert headers["Content-Type"] == "application/x-protobuf"


def test_after_shutdown_nothing_is_sent() -> None:
    s = _sender("http://127.0.0.1:9/v1/traces", [])
    s.shutdown()
    assert not s.export(BODY)


def test_settings_from_environment() -> None:
    r = OtlpHttpSettings.resolve(env={})
    assert r.endpoint == DEFAULT_ENDPOINT and r.timeout_s == 10.0 and r.compression is None and not r.headers
    r = OtlpHttpSettings.resolve(env={"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318/"})
    assert r.endpoint == "https://c:4318/v1/traces"
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x",
           "OTEL_EXPORTER_OTLP_HEADERS": "a=1", "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "api-key=s%20k,b=2",
           "OTEL_EXPORTER_OTLP_TIMEOUT": "3", "OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "deflate",
           "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE": "/ca.pem", "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": "/c.pem",
           "OTEL_EXPORTER_OTLP_CLIENT_KEY": "/k.pem"}
    r = OtlpHttpSettings.resolve(env=env)
    assert r.endpoint == "http://t/x" and r.headers == {"api-key": "s k", "b": "2"} and r.timeout_s == 3.0
    assert r.compression == "deflate" and (r.ca_file, r.client_cert, r.client_key) == ("/ca.pem", "/c.pem", "/k.pem")
    r = OtlpHttpSettings.resolve("http://explicit/v1/traces", {"h": "v"}, 1.5, env=env)
    assert r.endpoint == "http://explicit/v1/traces" and r.headers == {"h": "v"} and r.timeout_s == 1.5
    for bad in ({"OTEL_EXPORTER_OTLP_COMPRESSION": "br"}, {"OTEL_EXPORTER_OTLP_TIMEOUT": "0"},
                {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "ftp://x/"}):
        with pytest.raises(ValueError):
            OtlpHttpSettings.resolve(env=bad)


def test_child_does_not_use_the_sdk_otlp_exporter() -> None:
    """The child's otlp pipeline imports no OTLPSpanExporter (whose private
    ``_client`` / ``_max_request_size`` / ``_shutdown`` the old default path read)."""
    code = ("import sys; from audit.span_exporter_proc import build_pipeline; "
            "p = build_pipeline({'exporter': 'otlp', 'endpoint': 'http://127.0.0.1:9/v1/traces'}, env={}); "
            "p.shutdown(); print('opentelemetry.exporter.otlp.proto.http' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO)}, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_no_private_sdk_attributes_and_no_path_switch() -> None:
    for path in (REPO / "audit").glob("*.py"):
        text = path.read_text()
        for needle in ('"_client"', '"_max_request_size"', '"_shutdown"', "PREFIXGATE_SPAN_EXPORT_PATH"):
            assert needle not in text, (path.name, needle)
