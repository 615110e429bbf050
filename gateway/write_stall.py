"""A bound on how long a streamed answer may wait for its client to accept bytes (session 6, N-3).

``upstream.read_timeout_s`` bounds the wait for the replica between two chunks of a stream, but
nothing bounded the wait for the *client*: uvicorn's ``send`` waits (``flow.drain``) while the
connection's write buffer is above its high-water mark, so a client that stops reading held its
stream — the upstream connection (a pool shared by all tenants), its tenant's concurrency slot and
the replica's load in the router's view — until it closed (review R6, observation; on loopback the
socket buffers absorbed ~240 kB first).

:class:`StallBoundedSend` wraps the ``send`` of a streamed answer: a ``send`` that has not
returned ``limits.client_write_stall_s`` seconds after it started raises :class:`WriteStall`
(one loop timer per stream: :class:`gateway.read_deadline.ReadDeadline`). The stream then ends as
a client disconnect does: the relay is closed, the upstream response closed (the replica sees the
connection go), the request's slot and load given back and its tenant charged the output tokens
relayed so far (ledger basis ``relayed``; audit 499 ``client_disconnect``). :func:`end_stalled`
aborts the client connection (the guarded listener's :class:`gateway.client_io.ConnectionLoss`
``abort``): closing it would wait for the unread buffer to drain, forever.
"""
from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Scope, Send

from gateway.client_io import LOSS_KEY
from gateway.read_deadline import ReadDeadline

__all__ = ["StallBoundedSend", "WriteStall", "end_stalled", "DEFAULT_CLIENT_WRITE_STALL_S"]

DEFAULT_CLIENT_WRITE_STALL_S = 60.0


class WriteStall(Exception):
    """The client accepted no bytes of a streamed answer for ``stall_s`` seconds."""


class StallBoundedSend:
    """``send`` (an ASGI send callable) whose every call must return within ``stall_s`` seconds
    (> 0; else :class:`ValueError`), or raises :class:`WriteStall`. Use from one task (the answer's);
    :meth:`close` when the answer ends (cancels the one timer)."""

    __slots__ = ("send", "deadline")

    def __init__(self, send: Send, stall_s: float) -> None:
        self.send = send
        self.deadline = ReadDeadline(stall_s)

    async def __call__(self, message: Any) -> None:
        try:
            await self.deadline.read(self.send(message))
        except TimeoutError:
            raise WriteStall(f"client accepted nothing for {self.deadline.timeout_s:g} s") from None

    def close(self) -> None:
        """Cancel the timer (idempotent)."""
        self.deadline.close()


async def end_stalled(scope: Scope) -> None:
    """Abort the client connection of ``scope`` (guarded listener only: its ConnectionLoss has
    ``abort``), then yield once so the protocol marks the request disconnected before the ASGI call
    returns (uvicorn then logs nothing; without an abort it logs and closes)."""
    loss = scope.get(LOSS_KEY)
    abort = getattr(loss, "abort", None)
    if abort is not None:
        abort()
        await asyncio.sleep(0)
