"""Session 9 review, R9-1: unbounded read-and-drop of client bytes while an answer is in progress.

Before the fix, two paths read the client's socket at line rate and threw the bytes away for as long
as an answer was in progress (the reviewer: 14-21 GB swallowed in 5-8 s, ~30 % of the event loop's
core, nothing bounded, audited or charged): (a) h11, bytes after a ``Connection: close`` request
(R8b-1's drop, ``MUST_CLOSE``); (b) a pipelined head refused while an answer is in progress (invalid
bytes, a pipelined ``Upgrade`` head: the deferred refusal of gateway/upgrade_guard.py), under both
parsers. Now the gateway stops reading (the way uvicorn pauses for a pipelined request): a client
that keeps sending behind a streamed answer blocks in its send after the kernel buffers; the answer
still completes for a client that reads it, then the connection closes (lingering, bounded).
Over real loopback sockets, both parsers, a streamed answer held open until the test releases it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gateway.config_http import LimitsConfig
from gateway.server import uvicorn_config
from tests.hostile.test_i10_header_limits import PARSERS, _parse_responses, close, read_until_closed
from tests.support.listeners import serving

#: what the client tries to push behind the request while the answer is in progress
FLOOD_BYTES = 64 * 1024 * 1024
PIECE = b"Z" * (256 * 1024 - 1) + b"\n"  # not a request
#: a send that makes no progress for this long counts as blocked (the gateway stopped reading)
STALL_S = 1.5
FIRST = b"first-chunk;"
LAST = b"last-chunk."
UPGRADE_HEAD = b"GET /stream HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: 0\r\n\r\n"


class Held:
    """A streaming ASGI app: answers ``FIRST`` at once, ``LAST`` once :attr:`release` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.calls = 0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        self.calls += 1
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        await send({"type": "http.response.body", "body": FIRST, "more_body": True})
        await self.release.wait()
        await send({"type": "http.response.body", "body": LAST, "more_body": False})


@pytest.fixture
async def held() -> AsyncIterator[Callable[[str], Awaitable[tuple[tuple[str, int], Held]]]]:
    async with serving() as serve:
        async def _start(parser: str) -> tuple[tuple[str, int], Held]:
            app = Held()
            # a generous linger so the end of this test is not a race between the discard and the client
            limits = LimitsConfig(lingering_close_bytes=2 * FLOOD_BYTES)
            return await serve(uvicorn_config(app, "127.0.0.1", 0, http=parser, limits=limits)), app

        yield _start


async def flood(writer: asyncio.StreamWriter) -> tuple[int, bool]:
    """Send ``PIECE`` after ``PIECE`` up to ``FLOOD_BYTES``: (bytes handed over, True when a send blocked)."""
    sent = 0
    while sent < FLOOD_BYTES:
        writer.write(PIECE)
        sent += len(PIECE)
        try:
            await asyncio.wait_for(writer.drain(), STALL_S)
        except asyncio.TimeoutError:
            return sent, True
        except ConnectionError:
            return sent, False
    return sent, False


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("mode", ["close_then_junk", "junk", "pipelined_upgrade"])
async def test_bytes_behind_an_answer_in_progress_are_not_read_at_line_rate(held: Any, parser: str, mode: str) -> None:
    addr, app = await held(parser)
    reader, writer = await asyncio.open_connection(*addr)
    try:
        head = b"GET /stream HTTP/1.1\r\nHost: t\r\n" + (b"Connection: close\r\n" if mode == "close_then_junk" else b"")
        writer.write(head + b"\r\n")
        await writer.drain()
        seen = b""
        while FIRST not in seen:  # the answer is in progress
            chunk = await asyncio.wait_for(reader.read(65536), 10)
            assert chunk, "closed before the answer started"
            seen += chunk
        if mode == "pipelined_upgrade":
            writer.write(UPGRADE_HEAD)
        sent, blocked = await flood(writer)
        # before the fix: all 64 MiB taken (and dropped) while the answer was in progress, no send blocked
        assert blocked, f"the gateway took all {sent} bytes sent behind the answer in progress"
        assert sent < FLOOD_BYTES
        assert app.calls == 1
        app.release.set()  # the answer completes for a client that reads it
        data, closed = await asyncio.wait_for(read_until_closed(reader), 20)
    finally:
        app.release.set()
        await close(writer)
    responses = _parse_responses(seen + data)
    assert closed
    assert [r.status for r in responses][:1] == [200]
    assert responses[0].body == FIRST + LAST
    assert all(r.status == 400 for r in responses[1:]), [r.status for r in responses]
    assert app.calls == 1  # nothing behind the answer reached the app
