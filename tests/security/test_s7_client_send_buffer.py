"""Review R7b-4: ``server.client_send_buffer_bytes`` bounds each accepted client socket's send
buffer (SO_SNDBUF), so the kernel cannot swallow a whole answer (autotuned up to tcp_wmem max,
4 MiB) and hide a client that reads nothing from ``limits.client_min_read_bytes_per_s``."""
from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

import gateway.send_buffer as send_buffer
from gateway.config_http import ServerConfig
from gateway.http_guard import PARSERS
from gateway.server import uvicorn_config
from tests.support.listeners import serving


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def test_config_key_default_and_null() -> None:
    assert ServerConfig().client_send_buffer_bytes == 131072
    assert ServerConfig.model_validate({"client_send_buffer_bytes": None}).client_send_buffer_bytes is None
    with pytest.raises(Exception):
        ServerConfig.model_validate({"client_send_buffer_bytes": 10})


def test_apply_bounds_a_real_socket() -> None:
    a, b = socket.socketpair(socket.AF_UNIX)
    with a, b:
        send_buffer.apply(a, 65536)
        assert a.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) <= 2 * 65536
        send_buffer.apply(None, 65536)  # no socket (e.g. a test transport): ignored


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("nbytes", [65536, None])
async def test_accepted_socket_gets_the_bound(monkeypatch: Any, parser: str, nbytes: int | None) -> None:
    seen: list[tuple[int | None, int]] = []
    real = send_buffer.apply

    def spy(sock: Any, n: int | None) -> None:
        real(sock, n)
        seen.append((n, sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)))

    monkeypatch.setattr(send_buffer, "apply", spy)
    async with serving() as serve:
        addr = await serve(uvicorn_config(_app, "127.0.0.1", 0, http=parser, client_send_buffer_bytes=nbytes))
        reader, writer = await asyncio.open_connection(*addr)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        writer.close()
    if nbytes is None:  # kernel default: no setsockopt at all
        assert seen == []
    else:
        assert len(seen) == 1 and seen[0][0] == nbytes
        assert seen[0][1] <= 2 * nbytes  # Linux doubles the value for bookkeeping; autotuning is off
