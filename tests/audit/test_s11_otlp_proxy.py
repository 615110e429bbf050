"""Session 11: the audit worker's two OTLP senders (log sink, span sender) take the same proxy: the
environment's ``http_proxy`` / ``https_proxy`` unless ``no_proxy`` covers the host, read once at build
(audit.http_proxy); the log sink went direct before, the span sender re-read it before every POST."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.sdk.resources import Resource

from audit.event import AuditEvent, Kind, Outcome
from audit.http_proxy import env_proxy
from audit.otlp import OtlpLogSink
from audit.otlp_traces import OtlpHttpSettings
from audit.span_post import SpanPoster

_ENDPOINT = "http://collector.invalid:4318"


@pytest.fixture
def proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
                 "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)


def test_env_proxy_rules(proxy_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    direct: tuple[dict[str, Any], dict[str, str]] = ({}, {})
    assert env_proxy(_ENDPOINT + "/v1/logs") == direct
    monkeypatch.setenv("HTTP_PROXY", "http://user:secret@proxy.example:3128")
    basic = {"Proxy-Authorization": "Basic dXNlcjpzZWNyZXQ="}  # user:secret
    assert env_proxy(_ENDPOINT + "/v1/logs") == ({"proxy": "http://proxy.example:3128"}, basic)
    assert env_proxy("https://collector.invalid/v1/logs") == direct  # no https_proxy
    monkeypatch.setenv("HTTPS_PROXY", "http://user:secret@proxy.example:3128")  # CONNECT carries the credentials
    assert env_proxy("https://collector.invalid/v1/logs") == (
        {"proxy": "http://proxy.example:3128", "proxy_headers": basic}, {})
    monkeypatch.setenv("NO_PROXY", "collector.invalid")
    assert env_proxy(_ENDPOINT + "/v1/logs") == direct
    monkeypatch.delenv("NO_PROXY")
    monkeypatch.setenv("HTTPS_PROXY", "https://proxy.example:3129")  # not an http:// proxy: direct
    assert env_proxy("https://collector.invalid/v1/logs") == direct


def test_no_proxy_cidr_covers_an_ip_collector(proxy_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """R11b-3: ``no_proxy=10.0.0.0/8`` keeps a 10.x collector direct (as ``requests`` does), never through
    the proxy; a name, an address outside the range and a malformed entry are unaffected."""
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.example:3128")
    via = ({"proxy": "http://proxy.example:3128"}, {})
    monkeypatch.setenv("NO_PROXY", "bogus/99, 10.0.0.0/8,fd00::/8")
    assert env_proxy("http://10.1.2.3:4318/v1/logs") == ({}, {})
    assert env_proxy("http://[fd00::5]:4318/v1/logs") == ({}, {})
    assert env_proxy("http://11.1.2.3:4318/v1/logs") == via
    assert env_proxy("http://collector.invalid:4318/v1/logs") == via


async def _proxy_server(seen: list[tuple[str, str, Any]]) -> tuple[web.AppRunner, int]:
    """A stand-in HTTP proxy: answers every request itself (200, empty body) and records its target."""
    async def handle(request: web.Request) -> web.Response:
        await request.read()
        seen.append((request.host, request.path, request.headers.get("Proxy-Authorization")))
        return web.Response(status=200, body=b"", content_type="application/x-protobuf")

    app = web.Application()
    app.router.add_route("POST", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]


def test_log_sink_and_span_sender_both_post_through_the_env_proxy(proxy_env: None,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> list[tuple[str, str, Any]]:
        seen: list[tuple[str, str, Any]] = []
        runner, port = await _proxy_server(seen)
        monkeypatch.setenv("HTTP_PROXY", f"http://u:p@127.0.0.1:{port}")
        try:
            sink = OtlpLogSink(_ENDPOINT + "/v1/logs", timeout_s=5)
            await sink.send([AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED)])
            await sink.close()
            dropped: list[Any] = []
            poster = SpanPoster(Resource({"service.name": "t"}), OtlpHttpSettings.resolve(_ENDPOINT + "/v1/traces"),
                                lambda n, reason: dropped.append((n, reason)), flush_interval_s=0.05)
            assert await poster._post(b"\x0a\x00", 1)  # noqa: SLF001 -- one POST, no batching
            await poster.close(1.0)
            assert dropped == []
        finally:
            await runner.cleanup()
        return seen

    seen = asyncio.run(main())
    assert [p for _h, p, _a in seen] == ["/v1/logs", "/v1/traces"]
    assert all(h.startswith("collector.invalid") for h, _p, _a in seen)
    assert [a for _h, _p, a in seen] == ["Basic dTpw", "Basic dTpw"]  # u:p from the proxy URL
