"""Bounds on how long a streamed answer may wait for its client (session 6 N-3, session 7 R6b-3).

``upstream.read_timeout_s`` bounds the wait for the replica between two chunks of a stream, but
nothing bounded the wait for the *client*: uvicorn's ``send`` waits (``flow.drain``) while the
connection's write buffer is above its high-water mark, so a client that stops reading held its
stream — the upstream connection (a pool shared by all tenants), its tenant's concurrency slot and
the replica's load in the router's view — until it closed (review R6, observation; on loopback the
socket buffers absorbed ~240 kB first).

:class:`StallBoundedSend` wraps the ``send`` of a streamed answer and ends it on any of three
bounds (one loop timer per stream: :class:`gateway.read_deadline.ReadDeadline`):

* ``limits.client_write_stall_s``: one ``send`` not returned that long after it started
  (audit code ``client_write_stall``);
* ``limits.client_min_read_bytes_per_s`` (R6b-3): while the answer waits on its client, the client
  must take at least this many bytes per second, with ``limits.client_min_read_window_s`` seconds
  of slack: a bucket of seconds (capacity ``client_min_read_window_s``) from which each send takes
  the seconds it waited and to which it gives ``bytes / rate`` for the bytes known to have left the server's
  buffer since the last send (uvicorn waits before it writes, so past a send's wait all bytes
  handed before it but :data:`WRITE_HIGH_WATER` did: the count is of bytes the client took, not of
  bytes the replica produced, which the upstream connection buffers up to 1 MiB); empty → the stream
  ends (``client_read_too_slow``). A client that reads a little just before each per-write deadline
  no longer holds its stream for the whole answer: one taking a fraction ``f`` of the rate is ended
  after about ``client_min_read_window_s / (1 - f)`` seconds of waiting. Kernel socket buffers (a few
  hundred kB) are one-time slack;
* ``limits.max_stream_s`` (Envoy's ``max_stream_duration``): the answer's wall-clock time since its
  first send; checked at each send and bounding the wait of each (``stream_duration_exceeded``).

The work per send is two loop-clock reads and a few float operations (issue 14); nothing per byte. Session 24:
a send that returns without waiting (the server had room) arms no bound (it could not break one).
The stream then ends as a client disconnect does: the relay is closed, the upstream response closed
(the replica sees the connection go), the request's slot and load given back and its tenant charged
the output tokens relayed so far (ledger basis ``relayed``; audit 499 with the bound's code, read by
the pipeline with :func:`ended_code`). :func:`end_stalled` aborts the client connection (the guarded
listener's :class:`gateway.client_io.ConnectionLoss` ``abort``): closing it would wait for the
unread buffer to drain, forever.
"""
from __future__ import annotations

import asyncio
import types
from collections.abc import Coroutine, Generator
from contextvars import ContextVar
from types import CoroutineType
from typing import Any

from starlette.types import Scope, Send

from gateway.client_io import LOSS_KEY
from gateway.read_deadline import ReadDeadline

__all__ = ["StallBoundedSend", "WriteStall", "end_stalled", "ended_code", "DEFAULT_CLIENT_WRITE_STALL_S"]

DEFAULT_CLIENT_WRITE_STALL_S = 60.0

#: audit error codes of the three bounds
STALL_CODE, SLOW_CODE, DURATION_CODE = "client_write_stall", "client_read_too_slow", "stream_duration_exceeded"

#: uvicorn's write buffer high-water mark (asyncio's default): a ``send`` starts writing only once
#: the buffer is below it (it waits in ``flow.drain`` otherwise), so at that point every byte handed
#: before, but this many, has been written to the kernel
WRITE_HIGH_WATER = 64 << 10

#: the code of the bound that ended the current task's stream (read by the pipeline's stream end)
_ENDED: ContextVar[str | None] = ContextVar("prefixgate_stream_ended_by", default=None)


class WriteStall(Exception):
    """A streamed answer broke one of its client-side bounds; ``code`` names which (one of
    ``client_write_stall``, ``client_read_too_slow``, ``stream_duration_exceeded``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def ended_code(default: str = "client_disconnect") -> str:
    """The audit error code for a stream that ended without its client: the bound's code when
    :class:`StallBoundedSend` ended it in this task, else ``default``."""
    return _ENDED.get() or default


class StallBoundedSend:
    """``send`` (an ASGI send callable) of one streamed answer under the bounds of the module doc.

    ``stall_s`` > 0 seconds per send (else :class:`ValueError`); ``min_rate`` bytes per second of
    the client's reading while the answer waits on it (``None``: no rate bound) with ``window_s``
    seconds of slack (> 0; default ``stall_s``); ``max_s`` seconds
    of the whole answer from its first send (``None``: none). ``body_send``: where a middle body part
    (``http.response.body`` with ``more_body``) goes instead of ``send`` (None: ``send`` too; session 24:
    the inference routes' ``send`` wrapper only acts on the start and the last part, so the parts between
    skip one coroutine layer). A call raises :class:`WriteStall` when a bound breaks. Use from one task
    (the answer's); :meth:`close` when the answer ends."""

    __slots__ = ("send", "body_send", "deadline", "stall_s", "min_rate", "window_s", "max_s", "budget", "end_at",
                 "handed", "taken", "_clock")

    def __init__(self, send: Send, stall_s: float, min_rate: float | None = None,
                 max_s: float | None = None, window_s: float | None = None, body_send: Send | None = None) -> None:
        self.send = send
        self.body_send = body_send
        self.deadline = ReadDeadline(stall_s)
        self.stall_s = stall_s
        self.min_rate = min_rate
        self.max_s = max_s
        self.window_s = stall_s if window_s is None else window_s
        if not self.window_s > 0:
            raise ValueError("window_s must be > 0")
        self.budget = self.window_s  # seconds of waiting on the client still allowed (rate bound)
        self.end_at: float | None = None
        self.handed = 0  # body bytes handed to ``send``
        self.taken = 0  # of which known to have left the server's buffer (credited)
        self._clock: Any = None

    @classmethod
    def for_limits(cls, send: Send, limits: Any, body_send: Send | None = None) -> StallBoundedSend:
        """The bounds of a :class:`gateway.config_http.LimitsConfig` (``client_write_stall_s``,
        ``client_min_read_bytes_per_s``, ``client_min_read_window_s``, ``max_stream_s``); ``body_send``: as
        the constructor's."""
        return cls(send, limits.client_write_stall_s, limits.client_min_read_bytes_per_s, limits.max_stream_s,
                   limits.client_min_read_window_s, body_send)

    async def __call__(self, message: Any) -> None:
        clock = self._clock
        if clock is None:
            clock = self._clock = asyncio.get_running_loop().time
        t0 = clock()
        rate = self.min_rate
        wait = self.stall_s
        code = STALL_CODE
        if rate is not None:
            # this send's wait may use the budget plus what draining the bytes handed before earns
            allowed = self.budget
            owed = self.handed - self.taken
            if owed > WRITE_HIGH_WATER:
                allowed += (owed - WRITE_HIGH_WATER) / rate
            if allowed < wait:
                wait, code = allowed, SLOW_CODE
        if self.max_s is not None:
            wait, code = self._duration_bound(t0, wait, code)
        send = self.body_send
        if send is None or not message.get("more_body") or message["type"] != "http.response.body":
            send = self.send
        work: Any = send(message)
        if type(work) is CoroutineType:
            # session 24: the send's first step is taken here; a send that returns in it (the server had room:
            # the usual case) cannot have waited, so no bound is armed for it. One that waits continues
            # under the bound from where it stopped (_resumed), as a whole send under the bound did.
            try:
                waiting = work.send(None)
            except StopIteration:
                work = None
            else:
                work = _resumed(work, waiting)
        if work is not None:
            deadline = self.deadline
            deadline.timeout_s = wait
            try:
                await deadline.read(work)
            except TimeoutError:
                self._end(code, f"client accepted nothing for {wait:g} s ({code})")
        if rate is not None:
            # the server waits before it writes: past the wait at most WRITE_HIGH_WATER bytes handed
            # before this send are still in the transport's buffer, the rest went to the kernel
            budget = self.budget - (clock() - t0)
            handed = self.handed
            if handed - self.taken > WRITE_HIGH_WATER:
                taken = handed - WRITE_HIGH_WATER
                budget += (taken - self.taken) / rate
                self.taken = taken
            if budget <= 0:
                self._end(SLOW_CODE, f"client read slower than {rate:g} bytes/s")
            window = self.window_s
            self.budget = budget if budget < window else window
            body = message.get("body")
            if body:
                self.handed = handed + len(body)

    def _duration_bound(self, now: float, wait: float, code: str) -> tuple[float, str]:
        """``(wait, code)`` lowered to the time left of ``max_stream_s``; raises past it."""
        end_at = self.end_at
        if end_at is None:
            end_at = self.end_at = now + self.max_s  # type: ignore[operator]
        if end_at - now < wait:
            wait, code = end_at - now, DURATION_CODE
            if wait <= 0:
                self._end(code, f"stream lasted {self.max_s:g} s")
        return wait, code

    @staticmethod
    def _end(code: str, message: str) -> None:
        _ENDED.set(code)
        raise WriteStall(code, message)

    def close(self) -> None:
        """Cancel the timer (idempotent)."""
        self.deadline.close()


@types.coroutine
def _resumed(work: Coroutine[Any, Any, Any], waiting: Any) -> Generator[Any, Any, Any]:
    """The rest of coroutine ``work``, whose first step yielded ``waiting`` (what it waits on) to its task:
    awaited, it hands the task what ``work`` yields and resumes ``work`` with what the task sends or throws
    in (a cancellation too), closing it when closed; its result is ``work``'s (PEP 380's ``yield from``,
    its first step already taken)."""
    while True:
        try:
            value = yield waiting
        except GeneratorExit:
            work.close()
            raise
        except BaseException as exc:  # a cancellation (the bound's or anyone's): into the send, as before
            try:
                waiting = work.throw(exc)
            except StopIteration as stop:
                return stop.value
        else:
            try:
                waiting = work.send(value)
            except StopIteration as stop:
                return stop.value


async def end_stalled(scope: Scope) -> None:
    """Abort the client connection of ``scope`` (guarded listener only: its ConnectionLoss has
    ``abort``), then yield once so the protocol marks the request disconnected before the ASGI call
    returns (uvicorn then logs nothing; without an abort it logs and closes)."""
    loss = scope.get(LOSS_KEY)
    abort = getattr(loss, "abort", None)
    if abort is not None:
        abort()
        await asyncio.sleep(0)
