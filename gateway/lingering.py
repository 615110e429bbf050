"""Lingering close of a connection whose request body is still arriving (review R5b-2).

When the server closes a connection (an early answer with ``Connection: close``:
401, 429, 413, a framing refusal) while the client is still sending the request
body, closing the socket with unread bytes in its receive queue makes the kernel
send a reset, and a client that uploads its whole body before reading (httpx,
the OpenAI SDK) may then lose the answer. Before R5b-2 the framing guard
(gateway/framing.py) avoided that by *parsing* up to 8 MiB of the rest of the
body before answering: one parser callback and ASGI message per chunk, ~12 ms of
gateway CPU per refused 8 MiB body in 1 KiB chunks, charged to nobody.

The approach of nginx (``lingering_close``, ``lingering_time``,
``lingering_timeout``) instead: send the answer, shut down the write side
(the client sees the answer and a FIN), then read and *discard* what the client
still sends, without parsing it, for a bounded time and number of bytes, then
close (measured, 8 MiB in 1 KiB chunks before a 401 on loopback: ~18 ms of CPU parsed
under httptools, ~78 ms under h11; ~3.4 ms discarded). :class:`LingeringTransport` wraps the connection's transport (as given to
uvicorn's protocol); its ``close`` does that when the protocol's
``guard_body_unfinished()`` says a request body is still being received:

- the answer already written is sent, then ``write_eof`` (half-close);
- reading is resumed (uvicorn may have paused it) and every byte received is
  counted and dropped by the protocol (``linger_discard``), never parsed;
- the connection is closed once ``max_bytes`` wire bytes were discarded, once
  ``timeout_s`` seconds have passed since the close began, or when the client
  closes its side (asyncio closes the transport on EOF).

Holding (review R9-1): :meth:`LingeringTransport.hold_reading` stops reading until the close, for
bytes that would only be dropped while an answer is still in progress (after a ``Connection: close``
request under h11; behind a pipelined head refused until that answer is complete): they stay in the
kernel's buffers and the client's send blocks, as uvicorn does for a pipelined request, instead of
being read and discarded at line rate for as long as the answer lasts. Such a connection's ``close``
lingers as above (bytes may be waiting: closing with unread bytes would reset it and could cost the
client the end of its answer), bounded the same way.

Unsent bytes at the close (review R9b-3): closing a transport waits until its write buffer has gone
out, and a client that never reads kept a connection whose whole answer was already buffered (so no
write-stall rule applied any more) open for ever, its descriptor and buffer with it. Every close
now checks, each ``timeout_s``, that the unsent bytes went down since the last check, and aborts the
connection when they did not (a client that reads, however slowly, keeps its answer; one that
stopped is cut after ``timeout_s``).

``close`` of a connection with no body in progress and no held reading, a second ``close``,
``close_now`` (used for bodies refused for their framing, gateway/body_guard.py)
and ``abort`` close at once. A transport that cannot half-close closes at once.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

__all__ = ["LingeringTransport", "lingering_cap", "DEFAULT_LINGERING_CLOSE_BYTES", "DEFAULT_LINGERING_CLOSE_S"]

DEFAULT_LINGERING_CLOSE_BYTES = 8 * 1024 * 1024
DEFAULT_LINGERING_CLOSE_S = 5.0


def lingering_cap(lingering_close_bytes: int | None, max_body_bytes: int) -> int:
    """Bytes a lingering close discards: ``lingering_close_bytes`` (``limits.lingering_close_bytes``),
    or when None max(4 x ``max_body_bytes``, 8 MiB) (the drain cap before R5b-2)."""
    if lingering_close_bytes is not None:
        return lingering_close_bytes
    return max(4 * max_body_bytes, DEFAULT_LINGERING_CLOSE_BYTES)


class _BodyState(Protocol):
    def guard_body_unfinished(self) -> bool: ...


class LingeringTransport:
    """An ``asyncio.Transport`` proxy whose ``close`` lingers while a request body is unfinished.

    ``transport``: the connection's transport; ``loop``: its event loop; ``protocol``:
    the guarded uvicorn protocol (its ``guard_body_unfinished()``: True while a
    request body is being received); ``max_bytes`` (bytes, >= 0) and ``timeout_s``
    (seconds, > 0): the bounds of the discard. ``is_closing()`` is True from the
    first ``close``. Every other attribute is the wrapped transport's.
    """

    __slots__ = ("_transport", "_loop", "_protocol", "_max_bytes", "_timeout_s", "_closing", "_timer",
                 "lingering", "discarded", "held", "_drain_timer", "_unsent")

    def __init__(self, transport: Any, loop: asyncio.AbstractEventLoop, protocol: _BodyState, *,
                 max_bytes: int = DEFAULT_LINGERING_CLOSE_BYTES,
                 timeout_s: float = DEFAULT_LINGERING_CLOSE_S) -> None:
        self._transport = transport
        self._loop = loop
        self._protocol = protocol
        self._max_bytes = max_bytes
        self._timeout_s = timeout_s
        self._closing = False
        self._timer: asyncio.TimerHandle | None = None
        self.lingering = False  # bytes received now are discarded (see :meth:`discard`)
        self.discarded = 0  # wire bytes discarded while lingering
        self.held = False  # reading stopped until the close (:meth:`hold_reading`)
        self._drain_timer: asyncio.TimerHandle | None = None  # R9b-3: the close's unsent-bytes check
        self._unsent = 0

    def is_closing(self) -> bool:
        """True once ``close`` or ``abort`` was called (or the wrapped transport is closing)."""
        return self._closing or self._transport.is_closing()

    def close(self) -> None:
        """Close; while a request body is unfinished, linger first (half-close, discard, bounded)."""
        if self._closing or self._transport.is_closing():
            self._closing = True
            self._finish()
            return
        self._closing = True
        if self._max_bytes <= 0 or not (self.held or self._protocol.guard_body_unfinished()):
            self._close_bounded()
            return
        try:
            if not self._transport.can_write_eof():
                self._close_bounded()
                return
            self._transport.write_eof()  # the answer written so far leaves first, then FIN
            self._transport.resume_reading()
        except (OSError, RuntimeError, AttributeError):
            self._close_bounded()
            return
        self.lingering = True
        self._timer = self._loop.call_later(self._timeout_s, self._finish)

    def hold_reading(self) -> None:
        """Stop reading until the close (R9-1): what the client sends next would only be dropped (an
        answer is still in progress); the close then lingers. Safe to call again (a flow-control
        resume in between, e.g. uvicorn's after a pipelined answer, is undone by the next call)."""
        self.held = True
        try:
            self._transport.pause_reading()
        except (RuntimeError, AttributeError):  # closing, or a transport that cannot pause: left as it is
            pass

    def close_now(self) -> None:
        """Close without lingering (a request refused for its framing: not worth keeping readable)."""
        self._closing = True
        self._finish()

    def discard(self, data: bytes) -> None:
        """Count and drop ``data`` received while lingering; close past ``max_bytes``."""
        self.discarded += len(data)
        if self.discarded > self._max_bytes:
            self._finish()

    def _finish(self) -> None:
        self.lingering = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._transport.is_closing():
            self._close_bounded()

    def _close_bounded(self) -> None:
        """Close the wrapped transport; while bytes are still unsent, check their progress (R9b-3)."""
        self._transport.close()
        self._check_unsent()

    def _check_unsent(self) -> None:
        self._drain_timer = None
        try:
            unsent = self._transport.get_write_buffer_size()
        except (AttributeError, RuntimeError):  # a transport without a write buffer: nothing to bound
            return
        if not unsent:
            return
        if self._unsent and unsent >= self._unsent:  # nothing went out for timeout_s: the client stopped
            self._transport.abort()
            return
        self._unsent = unsent
        self._drain_timer = self._loop.call_later(self._timeout_s, self._check_unsent)

    def connection_lost(self) -> None:
        """The connection is gone: stop the linger and unsent-bytes timers."""
        self.lingering = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None

    def abort(self) -> None:
        """Abort at once (no lingering)."""
        self._closing = True
        self.connection_lost()
        self._transport.abort()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Write ``data`` (dropped once closing)."""
        if not self._closing:
            self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        """``write`` of each item."""
        for data in list_of_data:
            self.write(data)

    def flush(self) -> None:
        """Write now what the wrapped transport holds back (its ``flush``, gateway/coalesce.py; nothing when
        it has none). Called when an answer is complete (gateway/http_guard.py, session 10)."""
        flush = getattr(self._transport, "flush", None)
        if flush is not None:
            flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
