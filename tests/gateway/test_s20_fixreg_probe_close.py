"""Session 20, helper fixreg (FT-2): the probe session survives a TLS peer that closes first.

On CPython 3.11.1-3.11.3 (Debian 12's 3.11.2, the shared venv) asyncio's ``_SSLProtocolTransport.close()`` on a
transport already closed drops its protocol, and a later ``abort()`` raises AttributeError (CPython gh-98539,
fixed in 3.11.4). aiohttp's ``enable_cleanup_closed`` keeps every TLS transport it closed and aborts it 2 s later
and at ``session.close()``: with a peer that closed first the periodic abort raised (swallowed by aiohttp, never
scheduled again: the list then grew with every such connection for the session's life) and ``close()`` raised
it. ``gateway.upstream.make_probe_session`` (health checks, engine metrics, verification probes) no longer asks
for it on those interpreters (``CLEANUP_CLOSED``). On an interpreter without the bug the test passes either way.
"""
from __future__ import annotations

import asyncio
import ssl
import sys
from pathlib import Path

import pytest

import gateway.upstream as upstream
from tests.support.tls import self_signed


async def _closing_first_tls_server(tmp: Path) -> tuple[asyncio.AbstractServer, Path]:
    cert, key = self_signed(tmp)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
        await writer.drain()
        writer.close()  # the server closes first

    return await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx), cert


async def test_closing_the_probe_session_after_a_tls_peer_closed_first(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    server, cert = await _closing_first_tls_server(tmp_path)
    port = server.sockets[0].getsockname()[1]
    trusting = ssl.create_default_context(cafile=str(cert))  # the test's CA, as audit/tls.py would with ca_file
    monkeypatch.setattr(upstream, "client_context", lambda: trusting)
    session = upstream.make_probe_session(5.0)
    try:
        for _ in range(3):
            async with session.get(f"https://127.0.0.1:{port}/health") as resp:
                assert resp.status == 200 and await resp.read() == b"{}"
    finally:
        await session.close()  # before: AttributeError on 3.11.1-3.11.3
        server.close()
        await server.wait_closed()


def test_the_cleanup_is_off_only_where_abort_after_close_raises() -> None:
    assert upstream.CLEANUP_CLOSED is not ((3, 11, 1) <= sys.version_info[:3] < (3, 11, 4))
