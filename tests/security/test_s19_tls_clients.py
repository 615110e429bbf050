"""S19-R3: every TLS client context PrefixGate builds has the TLS 1.2 floor and offers only
forward-secret suites, whatever the interpreter's build defaults (Debian's CPython 3.11 offers
OpenSSL's ``DEFAULT``: static-RSA and SHA-1 suites, no floor).

Each client (upstream pool, health/metrics probes, trust-bundle fetcher, remote OPA, Redis
``rediss://``, syslog over TLS, OTLP logs, the OTLP span senders on aiohttp and on ``requests``) makes
one connection to a local TLS server; every context that wraps a connection meanwhile is recorded
(``SSLContext.wrap_bio`` / ``wrap_socket``) and checked. The gateway serves no TLS itself: its
listeners get no ``ssl_*`` option (checked from the source below).
"""
from __future__ import annotations

import ast
import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from audit.tls import MINIMUM_VERSION, client_context, context_problems, requests_session
from tests.support.tls import self_signed

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "routing", "tenancy", "policy", "audit")


def test_the_client_context_has_the_floor_and_only_forward_secret_suites(tmp_path: Path) -> None:
    cert, _ = self_signed(tmp_path)
    for ctx in (client_context(), client_context(str(cert))):
        assert ctx.minimum_version >= MINIMUM_VERSION
        assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
        assert context_problems(ctx) == []
        assert {c["kea"] for c in ctx.get_ciphers()} <= {"kx-ecdhe", "kx-dhe", "kx-any"}


def test_the_check_sees_a_weak_context() -> None:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.MINIMUM_SUPPORTED
    ctx.set_ciphers("AES128-GCM-SHA256:ECDHE-RSA-AES128-SHA:ECDHE-RSA-AES128-GCM-SHA256")
    problems = context_problems(ctx)
    assert "minimum version MINIMUM_SUPPORTED" in problems
    assert "suite AES128-GCM-SHA256" in problems  # static RSA
    assert "suite ECDHE-RSA-AES128-SHA" in problems  # SHA-1 MAC
    assert "suite ECDHE-RSA-AES128-GCM-SHA256" not in problems


def _calls(path: Path) -> list[ast.Call]:
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call)]


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def test_only_audit_tls_builds_a_context_and_no_client_takes_a_library_default() -> None:
    """No module but audit/tls.py calls ``create_default_context`` / ``SSLContext``; no call passes
    ``ssl=True`` (aiohttp's default context), every aiohttp connector is given ``ssl=``, and
    ``requests.Session()`` is built only by audit/tls.py."""
    bad = []
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            for call in _calls(path):
                name = _name(call)
                kw = {k.arg: k.value for k in call.keywords}
                if name in ("create_default_context", "SSLContext", "create_urllib3_context") \
                        and rel != "audit/tls.py":
                    bad.append(f"{rel}:{call.lineno} {name}")
                if isinstance(kw.get("ssl"), ast.Constant) and kw["ssl"].value is True:
                    bad.append(f"{rel}:{call.lineno} ssl=True")
                if name == "TCPConnector" and "ssl" not in kw:
                    bad.append(f"{rel}:{call.lineno} TCPConnector without ssl=")
                if name == "Session" and ast.unparse(call.func) == "requests.Session" and rel != "audit/tls.py":
                    bad.append(f"{rel}:{call.lineno} requests.Session()")
    assert bad == []


def test_no_listener_serves_tls() -> None:
    """The server side: TLS ends at the proxy in front of the gateway (docs/security.md); no
    uvicorn ``Config``/``run`` of the gateway gets an ``ssl_*`` option and no server is started with
    ``ssl=`` (if one ever is, it must take a context with the same floor and suites)."""
    bad = []
    for pkg in ("gateway", "audit", "policy", "tenancy"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for call in _calls(path):
                kws = {k.arg or "" for k in call.keywords}
                if any(k.startswith("ssl_") for k in kws) and _name(call) in ("Config", "run", "Server"):
                    bad.append(f"{path.relative_to(ROOT)}:{call.lineno}")
                if _name(call) in ("start_server", "create_server", "create_unix_server") and "ssl" in kws:
                    bad.append(f"{path.relative_to(ROOT)}:{call.lineno}")
    assert bad == []


# ---------------------------------------------------------------- every client, one connection each
@pytest.fixture
async def tls_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[int, list[ssl.SSLContext]]]:
    """A TLS server answering one HTTP 200 per connection; the contexts of every client connection."""
    cert, key = self_signed(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the default roots: the test CA
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.read(65536)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n"
                         b"Connection: close\r\n\r\n{}")
            await writer.drain()
        writer.close()

    seen: list[ssl.SSLContext] = []
    wrap_bio, wrap_socket = ssl.SSLContext.wrap_bio, ssl.SSLContext.wrap_socket

    def bio(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("server_side"):
            seen.append(self)
        return wrap_bio(self, *args, **kwargs)

    def sock(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> Any:
        if not kwargs.get("server_side"):
            seen.append(self)
        return wrap_socket(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "wrap_bio", bio)
    monkeypatch.setattr(ssl.SSLContext, "wrap_socket", sock)
    srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=server_ctx)
    try:
        yield srv.sockets[0].getsockname()[1], seen
    finally:
        srv.close()


async def _upstream_pool(url: str, port: int) -> None:
    from gateway.upstream_pool import UpstreamPool
    pool = UpstreamPool(2, 5.0)
    try:
        resp = await pool.request("GET", url + "/health")
        resp.close()
    finally:
        await pool.close()


async def _probe_session(url: str, port: int) -> None:
    from gateway.upstream import make_probe_session
    session = make_probe_session(5.0)
    try:
        async with session.get(url + "/health") as resp:
            await resp.read()
    finally:
        await session.close()  # session 20, FT-2: no longer raises (tests/gateway/test_s20_fixreg_probe_close.py)


async def _bundle_source(url: str, port: int) -> None:
    from gateway.identity.bundle_sources import HttpsBundleSource
    src = HttpsBundleSource("example.org", url + "/bundle", timeout_s=5.0)
    try:
        with contextlib.suppress(Exception):  # "{}" is no bundle: only the connection matters
            await src.refresh()
    finally:
        await src.aclose()


async def _remote_opa(url: str, port: int) -> None:
    from policy.remote import RemoteOpa
    opa = RemoteOpa(url, health_timeout_s=5.0)
    try:
        await opa.start()
        await opa.health()
    finally:
        await opa.close()


async def _redis(url: str, port: int) -> None:
    from tenancy.shared_store import redis_client
    cfg = SimpleNamespace(url=f"rediss://127.0.0.1:{port}/0", username=None, password_file=None,
                          password_env=None, tls_ca_file=None, command_timeout_s=5.0)
    client = redis_client(cfg)
    try:
        with contextlib.suppress(Exception):  # not a Redis server: only the handshake matters
            await client.ping()
    finally:
        await client.aclose()


async def _syslog(url: str, port: int) -> None:
    from audit.syslog import SyslogSink
    sink = SyslogSink("127.0.0.1", port, "tls")
    try:
        await sink.open()
    finally:
        await sink.close()


async def _otlp_logs(url: str, port: int) -> None:
    from audit.otlp import OtlpLogSink
    sink = OtlpLogSink(endpoint=url + "/v1/logs", timeout_s=5.0)
    await sink.open()
    try:
        with contextlib.suppress(Exception):
            await sink.send([_event()])
    finally:
        await sink.close()


async def _span_post(url: str, port: int) -> None:
    import aiohttp

    from audit.otlp_traces import OtlpHttpSettings
    from audit.span_post import ssl_context
    connector = aiohttp.TCPConnector(ssl=ssl_context(OtlpHttpSettings(endpoint=url + "/v1/traces")))
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.post(url + "/v1/traces", data=b"") as resp:
            await resp.read()


async def _span_requests(url: str, port: int) -> None:
    from audit.otlp_traces import OtlpHttpSender, OtlpHttpSettings
    sender = OtlpHttpSender(OtlpHttpSettings(endpoint=url + "/v1/traces", timeout_s=5.0))
    try:
        await asyncio.to_thread(sender.export, b"")
    finally:
        sender.shutdown()


def _event() -> Any:
    from audit.event import AuditEvent, Identity, Kind, Outcome
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, time_ms=1_700_000_000_000, request_id="r",
                      identity=Identity("spiffe://example.org/w", "example.org"), tenant="t")


CLIENTS: dict[str, Callable[[str, int], Awaitable[None]]] = {
    "upstream_pool": _upstream_pool, "probe_session": _probe_session, "bundle_source": _bundle_source,
    "remote_opa": _remote_opa, "redis": _redis, "syslog": _syslog, "otlp_logs": _otlp_logs,
    "span_post": _span_post, "span_requests": _span_requests,
}


@pytest.mark.parametrize("client", sorted(CLIENTS))
async def test_every_client_context_has_the_floor_and_forward_secret_suites(client: str, tls_server) -> None:
    port, seen = tls_server
    await CLIENTS[client](f"https://127.0.0.1:{port}", port)
    assert seen, "no TLS connection was made"
    assert [context_problems(ctx) for ctx in seen] == [[] for _ in seen]


def test_the_requests_session_mounts_the_context_for_https() -> None:
    session = requests_session()
    try:
        adapter = session.get_adapter("https://collector.example:4318/v1/traces")
        assert context_problems(adapter.poolmanager.connection_pool_kw["ssl_context"]) == []
    finally:
        session.close()
