"""One upstream answer as its reader sees it (split from gateway/upstream_conn.py, session 8).

:class:`UpstreamResponse` is filled by its :class:`gateway.upstream_conn.UpstreamConnection`
(status, headers, body chunks, the end or the error) and read by the request
path (:mod:`gateway.proxy`). Since session 8 it can carry a deadline of its
own (:meth:`UpstreamResponse.watch_deadline`, one timer per pool:
:mod:`gateway.upstream_deadline`) instead of an ``asyncio.timeout`` around
each upstream call: when it passes before the answer is whole, every wait
on the answer raises ``TimeoutError`` and the connection is aborted (never
reused), as the cancelled call did before.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from gateway.upstream_deadline import DeadlineWatch

__all__ = ["UpstreamResponse", "AnswerSource"]


class AnswerSource(Protocol):
    """The connection an answer is read from (:class:`gateway.upstream_conn.UpstreamConnection`)."""

    def resume(self) -> None: ...  # noqa: D102

    def abort(self) -> None: ...  # noqa: D102


class UpstreamResponse:
    """One answer: ``status`` (int) and ``headers`` (lower-case name -> value; repeated fields joined
    with ``", "``) once :meth:`wait_head` returned, then the raw body by :meth:`read_chunk`.

    ``complete``: the whole body arrived (it may still be buffered here).
    Always :meth:`close` it: before ``complete`` that aborts the connection.
    """

    __slots__ = ("status", "headers", "complete", "_conn", "_chunks", "_buffered", "_error", "_waiter",
                 "_head_seen", "_closed", "_watch", "_loop", "_read_bound_s", "_read_due", "_read_timer")

    def __init__(self, conn: AnswerSource, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}
        self.complete = False
        self._conn: AnswerSource | None = conn
        self._chunks: list[bytes] = []
        self._buffered = 0
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._head_seen = False
        self._closed = False
        self._watch: DeadlineWatch | None = None
        #: the connection's loop (None: looked up at each wait; session 10, one ``getpid`` less per wait on 3.11)
        self._loop = loop
        self._read_bound_s: float | None = None  # seconds one read may wait (:meth:`bound_reads`), or None
        self._read_due = 0.0  # loop time the current wait's bound passes
        self._read_timer: asyncio.TimerHandle | None = None  # the one timer of the bound (session 24)

    def watch_deadline(self, watch: DeadlineWatch, deadline: float, loop: asyncio.AbstractEventLoop) -> None:
        """From now until :meth:`clear_deadline` (or :meth:`close`), once ``loop.time()`` reaches
        ``deadline`` (seconds) before the answer is whole, :meth:`wait_head` and :meth:`read_chunk`
        raise ``TimeoutError`` and the connection is aborted (:meth:`expire`)."""
        self._watch = watch
        watch.add(self, deadline, loop)

    def clear_deadline(self) -> None:
        """Stop watching the deadline set by :meth:`watch_deadline` (idempotent)."""
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.discard(self)

    def expire(self) -> None:
        """The deadline passed: an answer not yet whole fails with ``TimeoutError`` (its connection
        is aborted, its replica's work cancelled); a whole, failed or closed one is left as it is."""
        self._watch = None
        if self.complete or self._error is not None or self._closed:
            return
        conn = self._conn
        self._fail(TimeoutError("the replica did not answer before the deadline"))
        if conn is not None:
            conn.abort()

    async def wait_head(self) -> None:
        """Wait for the status line and headers; raises the connection's error if it failed first."""
        while not self._head_seen:
            if self._error is not None:
                raise self._error
            # _wait inline: one coroutine frame less on the answer's critical path (session 15)
            self._waiter = (self._loop or asyncio.get_running_loop()).create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def bound_reads(self, timeout_s: float) -> None:
        """From now on, a :meth:`read_chunk` that waits longer than ``timeout_s`` seconds (loop clock) for
        body bytes raises ``TimeoutError`` (the connection is left to :meth:`close`, which aborts it).

        Session 24 (issue 14): a streamed answer's read bound (``upstream.read_timeout_s`` between two
        chunks) was a :class:`gateway.read_deadline.ReadDeadline` around each read: a coroutine, a task
        lookup and a task cancellation per expiry. Here the bound is one timer per answer (armed at the
        first wait, re-armed at its fire for the current wait's own bound, as ReadDeadline does) that
        fails the waiting read's future: a read costs one loop-clock reading. A read that returns buffered
        bytes does not wait and is not bounded (as before: it returned before any timer could fire). Raises
        :class:`ValueError` for ``timeout_s`` <= 0."""
        if not timeout_s > 0:
            raise ValueError("timeout_s must be > 0")
        self._read_bound_s = timeout_s
        self._cancel_read_timer()  # a lower bound than the armed one: armed again at the next wait

    async def read_chunk(self) -> bytes:
        """All body bytes buffered so far (waiting for some), b"" at the end of the body.

        Raises :class:`UpstreamProtocolError` or :class:`UpstreamConnectionLost`
        when the answer breaks off; :class:`RuntimeError` after :meth:`close`; ``TimeoutError`` when a wait
        passes the bound of :meth:`bound_reads`.
        """
        while True:
            if self._chunks:
                return self.take_buffered()
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            if self._closed:
                raise RuntimeError("the upstream response was closed")
            # _wait inline (session 24: one coroutine frame less per streamed read)
            loop = self._loop or asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            bound = self._read_bound_s
            if bound is not None:
                due = self._read_due = loop.time() + bound
                if self._read_timer is None:
                    self._read_timer = loop.call_at(due, self._read_expired, loop)
            try:
                await waiter
            finally:
                self._waiter = None

    def take_buffered(self) -> bytes:
        """The body bytes buffered so far, at once (b"" when none; never waits nor raises)."""
        chunks = self._chunks
        if not chunks:
            return b""
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._conn is not None:
            self._conn.resume()
        return data

    def at_eof(self) -> bool:
        """True when the whole body arrived and was read."""
        return self.complete and not self._chunks

    def close(self) -> None:
        """Drop the answer; an unfinished one aborts its connection (never reused). Idempotent."""
        self._closed = True
        self._chunks.clear()
        if self._read_timer is not None:
            self._cancel_read_timer()
        if self._watch is not None:
            self.clear_deadline()
        conn, self._conn = self._conn, None
        if conn is not None and not self.complete:
            conn.abort()

    def _read_expired(self, loop: asyncio.AbstractEventLoop) -> None:
        """The read bound's timer (:meth:`bound_reads`): the current wait, if any, fails with ``TimeoutError``
        once it has waited the bound; a later wait's bound arms the timer again (not waiting: the next wait
        arms it)."""
        self._read_timer = None
        waiter = self._waiter
        if waiter is None or waiter.done() or self._closed:
            return
        due = self._read_due
        if loop.time() < due:
            self._read_timer = loop.call_at(due, self._read_expired, loop)
            return
        waiter.set_exception(TimeoutError())  # as ReadDeadline raised it (no message)

    def _cancel_read_timer(self) -> None:
        timer, self._read_timer = self._read_timer, None
        if timer is not None:
            timer.cancel()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        w = self._waiter  # _wake inline (session 18: one call less per body piece on the answer's path)
        if w is not None and not w.done():
            w.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        if not self.complete and self._error is None:
            self._error = exc
        self._conn = None
        if self._read_timer is not None:
            self._cancel_read_timer()
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        self._conn = None
        if self._read_timer is not None:  # no wait is left to bound (and the timer would keep this answer alive)
            self._cancel_read_timer()
        w = self._waiter  # _wake inline (session 18)
        if w is not None and not w.done():
            w.set_result(None)
