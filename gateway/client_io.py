"""The client side of one request: disconnect detection and a streaming answer
that ends its request however its ASGI call ends."""

from __future__ import annotations

import asyncio
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
    ``work`` runs in the calling task; one watcher task waits for the
    disconnect and, if it comes first, cancels the calling task (the
    cancellation lands inside ``work``: the watcher runs only while the
    caller is suspended there), which is turned into :class:`ClientGone`. A
    cancellation from anyone else is passed on unchanged.
    """
    task = asyncio.current_task()
    if task is None:  # not in a task: nothing to cancel
        return await work
    gone = False

    async def watch() -> None:
        nonlocal gone
        await _wait_disconnect(request)
        gone = True
        task.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        result = await work
    except asyncio.CancelledError:
        if not gone or task.uncancel() > 0:  # not (only) ours: someone else cancelled the request too
            raise
        raise ClientGone() from None
    finally:
        watcher.cancel()
    if gone:  # ``work`` swallowed the cancellation: the client is gone all the same
        task.uncancel()
        raise ClientGone()
    return result


async def _wait_disconnect(request: Request) -> None:
    """Return when the client disconnects (consumes no body: call after reading it)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
