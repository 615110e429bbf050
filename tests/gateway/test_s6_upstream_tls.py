"""https replicas through the upstream pool: verified against the given (or the system's) roots;
an unverifiable certificate is a connect failure that never reached the replica."""
from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import pytest

from gateway.proxy import UpstreamFailure, make_session, open_upstream
from gateway.upstream_pool import UpstreamPool
from tests.support.tls import self_signed

BODY = b'{"ok":true}'


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n") if x.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                         % (len(BODY), BODY))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
        pass
    finally:
        writer.close()


@pytest.fixture
async def tls_replica(tmp_path: Path):
    cert, key = self_signed(tmp_path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    srv = await asyncio.start_server(_handle, "127.0.0.1", 0, ssl=ctx)
    yield f"https://127.0.0.1:{srv.sockets[0].getsockname()[1]}", cert
    srv.close()


async def test_https_replica_verified_against_given_roots_and_kept_alive(tls_replica) -> None:
    url, cert = tls_replica
    pool = UpstreamPool(2, 2.0, ssl_context=ssl.create_default_context(cafile=str(cert)))
    try:
        for _ in range(2):
            up = await open_upstream(pool, url + "/v1/completions", {"a": 1}, {}, 5.0)
            assert up.first_chunk + await up.read_rest() == BODY
            up.close()
        assert pool.open_connections == 1
    finally:
        await pool.close()


async def test_unverifiable_certificate_is_a_connect_failure(tls_replica) -> None:
    url, _ = tls_replica
    pool = make_session(2, 2.0, 5.0)  # the system's roots: the self-signed certificate is unknown
    try:
        with pytest.raises(UpstreamFailure) as ei:
            await open_upstream(pool, url + "/v1/completions", {"a": 1}, {}, 5.0)
        assert ei.value.kind == "connect" and not ei.value.reached
        assert pool.open_connections == 0
    finally:
        await pool.close()
