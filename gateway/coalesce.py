"""One socket write per event-loop step for a server connection (issue 14).

uvicorn writes a response's status line and headers with one ``transport.write``
and each body part with another; under uvloop every write is a ``send``
system call at once, and on loopback each send also runs the receiver's TCP
path and wakes it: a plain answer cost two such sends (profile, session 4:
~13 % of the gateway's samples in ``RequestResponseCycle.send``).
:class:`CoalescingTransport` wraps the connection's transport (handed to the
protocol in ``connection_made``): writes are held and leave as one (a plain answer's head and body,
written in one task step) at the latest by a ``call_soon`` callback at the end of this loop
step, before the loop next waits for I/O (sooner: see "Session 10" below). Nothing is reordered and
nothing waits for more data: a write goes out in the same loop iteration as before.
Measured (strace, 2,000 sequential requests): 4.0 -> 3.0 writes and
4.0 -> 3.65 ``epoll_pwait`` calls per request. ``close`` and ``write_eof`` write what is
buffered first; ``abort`` drops it (as the transport's own ``abort`` drops
its buffer). A write on a closing transport is dropped, as the transport
itself would. Every other attribute is the wrapped transport's.

Session 10 (issue 14): writes are held until the end of the loop step, until the answer is complete
(the guarded listener's ``on_response_complete`` calls :meth:`CoalescingTransport.flush`,
gateway/http_guard.py) or until :data:`FLUSH_AT` bytes are held, whichever comes first; no longer
"until the second write". A streamed answer whose whole upstream body came at once (head, the part,
the chunk terminator, written in one step) now leaves in one write instead of two, and its terminator no
longer waits for one more loop round; a plain answer leaves in one write as before; a live stream's
first part leaves at the end of its step, as every later part already did (the relay then waits for the
replica). One ``call_soon`` per loop step with writes, not one per flush.

Session 28 (issue 14): a live stream's parts between its first and the one holding ``[DONE]`` leave at once
(:meth:`CoalescingTransport.write_through`, switched by the relay, gateway/pipeline_answer.py, through the
scope's ``ConnectionLoss``): holding them saved no write (the relay writes one part per step, then waits for
the replica) but cost a ``call_soon`` callback and a loop wake-up (an ``epoll_wait``) per SSE event.

Audit ordering (issue 16) is unchanged: the request's audit event is handed
to the audit worker before the last body part is handed to the server, so
before it reaches this buffer and the socket.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["CoalescingTransport", "FLUSH_AT"]

#: bytes held at which they leave at once (uvicorn's write high-water mark: flow control and the write-stall
#: bounds, gateway/write_stall.py, see big answers as soon as before)
FLUSH_AT = 64 << 10


class CoalescingTransport:
    """An ``asyncio.Transport`` proxy that holds a write until the next one or the end of the loop step.

    ``transport``: the connection's transport; ``loop``: its event loop. Methods
    other than ``write``, ``writelines``, ``write_eof``, ``close``, ``abort`` and
    ``get_write_buffer_size`` (which counts the bytes held here) are delegated.
    """

    __slots__ = ("_transport", "_loop", "_pending", "_scheduled", "_held", "_through")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._scheduled: asyncio.Handle | None = None  # the queued end-of-step callback
        self._held = 0  # bytes in ``_pending``
        self._through = False  # writes leave at once (:meth:`write_through`, session 28)

    @property
    def transport(self) -> asyncio.Transport:
        """The wrapped transport."""
        return self._transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer ``data`` until the end of this loop step (dropped if the transport is closing)."""
        if not data or self._transport.is_closing():
            return
        if self._through:  # session 28: a live stream's middle part leaves now, after anything held
            if self._pending:
                self._pending.append(bytes(data))
                self.flush()
            else:
                self._transport.write(data)
            return
        self._pending.append(bytes(data))
        self._held += len(data)
        if self._held >= FLUSH_AT:
            self.flush()
        elif self._scheduled is None:
            self._scheduled = self._loop.call_soon(self._end_of_step)

    def writelines(self, list_of_data: Any) -> None:
        """``write`` of each item."""
        for data in list_of_data:
            self.write(data)

    def write_through(self, on: bool) -> None:
        """While ``on``, a write leaves at once (with anything held before it, in one write) instead of at the
        end of the loop step; ``False`` holds writes again (the default). Session 28 (issue 14): a live
        stream's relay writes one part per loop step and then waits for the replica, so holding that part
        bought no fewer writes, only one ``call_soon`` callback and one more loop iteration per SSE event
        (~1.7 µs of CPU per event, ``bench.coalesce_stream_micro``). The relay turns it on after the
        stream's first part (which leaves with the head) and off before the part holding ``[DONE]`` (which
        leaves with the chunked terminator) and when the stream ends however it ends. Same bytes, same
        order; a write on a closing transport is still dropped."""
        self._through = on

    def _end_of_step(self) -> None:
        self._scheduled = None
        self.flush()

    def flush(self) -> None:
        """Write what is buffered now (one write; nothing when the transport is closing). The end-of-step
        callback queued for these bytes is cancelled: it would find nothing (session 14: a plain answer
        is flushed when complete, so its callback was one no-op Python call per request)."""
        pending = self._pending
        if not pending:
            return
        if self._scheduled is not None:
            self._scheduled.cancel()
            self._scheduled = None
        self._pending = []
        self._held = 0
        if self._transport.is_closing():
            return
        self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def write_eof(self) -> None:
        """Write what is buffered, then the transport's ``write_eof``."""
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        """Write what is buffered, then close (the transport sends its buffer before closing)."""
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        """Drop what is buffered and abort the connection."""
        self._pending = []
        self._held = 0
        self._transport.abort()

    def is_closing(self) -> bool:
        """The wrapped transport's ``is_closing`` (asked several times per request: not delegated by lookup)."""
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        """The transport's buffered bytes plus those held here."""
        return self._transport.get_write_buffer_size() + self._held

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)
