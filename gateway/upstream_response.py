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
                 "_head_seen", "_closed", "_watch", "_loop")

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

    async def read_chunk(self) -> bytes:
        """All body bytes buffered so far (waiting for some), b"" at the end of the body.

        Raises :class:`UpstreamProtocolError` or :class:`UpstreamConnectionLost`
        when the answer breaks off; :class:`RuntimeError` after :meth:`close`.
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
            await self._wait()

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
        if self._watch is not None:
            self.clear_deadline()
        conn, self._conn = self._conn, None
        if conn is not None and not self.complete:
            conn.abort()

    async def _wait(self) -> None:
        self._waiter = (self._loop or asyncio.get_running_loop()).create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

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
        self._wake()

    def _finish(self) -> None:
        self.complete = True
        self._conn = None
        w = self._waiter  # _wake inline (session 18)
        if w is not None and not w.done():
            w.set_result(None)
