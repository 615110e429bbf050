"""The client side of one request: disconnect detection and a streaming answer
that ends its request however its ASGI call ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = ["ClientGone", "EndingStreamingResponse", "unless_client_leaves"]

T = TypeVar("T")


class EndingStreamingResponse(StreamingResponse):
    """A streaming answer that ends its request however its ASGI call ends.

    The body generator ends the request in its own ``finally``; but when the
    generator never started — the first ``send`` failed because the client
    was gone (ASGI 2.4: ``OSError``), or the sending task was cancelled
    before its first step — that ``finally`` never runs, and a generator left
    suspended at a ``yield`` only runs it whenever it is garbage-collected.
    So the call closes the generator (running its ending now if it stopped
    mid-way) and then calls ``on_end`` (idempotent), whatever way it ended.
    """

    def __init__(self, content: AsyncGenerator[bytes, None], *, on_end: Callable[[], None], **kw: Any) -> None:
        super().__init__(content, **kw)
        self._on_end = on_end
        self._content = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                await self._content.aclose()
            finally:
                self._on_end()


class ClientGone(Exception):
    """The client disconnected before the answer started (its upstream call is cancelled)."""


async def unless_client_leaves(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first: then cancel it and raise :class:`ClientGone`.

    Call only after the request body was read (it listens on ``receive``).
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if task in done:
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    raise ClientGone()


async def _wait_disconnect(request: Request) -> None:
    """Return when the client disconnects (consumes no body: call after reading it)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
