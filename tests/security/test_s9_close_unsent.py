"""Review R9b-3: a connection closed with bytes still unsent is aborted once they stop going out.

Closing an asyncio transport waits until its write buffer has gone out; a client that never reads
kept a connection whose whole answer was already buffered open for ever. Now
:class:`gateway.lingering.LingeringTransport` checks the unsent bytes every ``timeout_s`` after a
close and aborts when they did not go down; a client that reads, however slowly, keeps its answer.
End to end: a 16 MiB plain answer to a client that never reads, ``Connection: close``, both parsers.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
from starlette.responses import Response

from gateway.http_guard import guarded_protocol
from gateway.lingering import LingeringTransport
from tests.support.listeners import serving
from tests.support.waiting import wait_for


class _Transport:
    """A wrapped transport whose write buffer the test sets."""

    def __init__(self, unsent: int) -> None:
        self.unsent = unsent
        self.closed = self.aborted = False

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def get_write_buffer_size(self) -> int:
        return self.unsent


class _Idle:
    def guard_body_unfinished(self) -> bool:
        return False


async def test_unsent_bytes_that_do_not_go_down_abort_the_connection() -> None:
    t = _Transport(300_000)
    lt = LingeringTransport(t, asyncio.get_running_loop(), _Idle(), timeout_s=0.05)
    lt.close()
    assert t.closed and not t.aborted
    await wait_for(lambda: t.aborted, timeout_s=5, what="the stalled close aborted")


async def test_a_client_that_reads_slowly_keeps_its_answer() -> None:
    # checks every 0.3 s, bytes go out every 0.03 s: about ten steps between two checks. It was one or
    # two (0.05 s checks): a process descheduled ~20 ms on a loaded machine let a check see no progress
    # and abort (seen in a loaded run of the security tests)
    t = _Transport(400_000)
    lt = LingeringTransport(t, asyncio.get_running_loop(), _Idle(), timeout_s=0.3)
    lt.close()
    for _ in range(40):  # ~1.2 s: bytes go out between every two checks (about four checks)
        await asyncio.sleep(0.03)
        t.unsent -= 10_000
        assert not t.aborted
    t.unsent = 0
    await asyncio.sleep(0.7)  # two more checks with nothing left
    assert not t.aborted


async def test_nothing_unsent_or_connection_gone_arms_nothing_more() -> None:
    t = _Transport(0)
    lt = LingeringTransport(t, asyncio.get_running_loop(), _Idle(), timeout_s=0.05)
    lt.close()
    t2 = _Transport(1000)
    lt2 = LingeringTransport(t2, asyncio.get_running_loop(), _Idle(), timeout_s=0.05)
    lt2.close()
    lt2.connection_lost()  # the peer went away: the check is cancelled
    await asyncio.sleep(0.15)
    assert not t.aborted and not t2.aborted


BIG = b"x" * (16 * 1024 * 1024)  # more than the kernel buffers of both sides hold


async def _big(scope: Any, receive: Any, send: Any) -> None:
    await Response(BIG, media_type="application/octet-stream")(scope, receive, send)


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_an_answer_never_read_does_not_hold_its_connection(parser: str) -> None:
    import uvicorn

    protocol = guarded_protocol(parser, lingering_close_s=0.3)
    lost: list[bool] = []

    class Watched(protocol):  # type: ignore[misc, valid-type]
        def connection_lost(self, exc: Exception | None) -> None:
            lost.append(True)
            super().connection_lost(exc)

    async with serving() as serve:
        host, port = await serve(uvicorn.Config(_big, host="127.0.0.1", port=0, http=Watched, lifespan="off",
                                                log_level="warning"))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        try:
            loop = asyncio.get_running_loop()
            await loop.sock_connect(sock, (host, port))
            await loop.sock_sendall(sock, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            # the client never reads: before R9b-3 the gateway's side stayed open with the answer unsent
            await wait_for(lambda: lost, timeout_s=20, what="the gateway dropped the connection it could not send on")
        finally:
            sock.close()
