"""A per-read timeout for a long stream of reads with one timer, not one per read.

``async with asyncio.timeout(t): await read()`` around every chunk of a streamed answer creates
and cancels an event-loop timer per chunk (~5-15 µs each on the 2-CPU bench machine; a streamed
answer relays tens to thousands of chunks). :class:`ReadDeadline` keeps one timer per stream: each
read only notes its start time; the timer, when it fires, either finds the current read older than
the bound (the read is cancelled and :class:`TimeoutError` raised from it, as ``asyncio.timeout``
does) or re-arms itself for the current read's own bound.
"""
from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["ReadDeadline"]

T = TypeVar("T")


class ReadDeadline:
    """Bounds every :meth:`read` of one task to ``timeout_s`` seconds (loop clock).

    Use from one task at a time, one read at a time (a streamed answer's relay loop). Raises
    :class:`ValueError` for ``timeout_s`` <= 0. A cancellation from anyone else is passed on
    unchanged; an expired read raises :class:`TimeoutError` and the task keeps no pending
    cancellation.
    """

    __slots__ = ("timeout_s", "_loop", "_task", "_start", "_reading", "_handle", "_expired", "_armed_at")

    def __init__(self, timeout_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError("timeout_s must be > 0")
        self.timeout_s = timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[object] | None = None
        self._start = 0.0
        self._reading = False
        self._handle: asyncio.TimerHandle | None = None
        self._armed_at = 0.0  # loop time the timer is set for (when ``_handle`` is not None)
        self._expired = False

    async def read(self, work: Awaitable[T]) -> T:
        """Await ``work``; :class:`TimeoutError` if it takes longer than ``timeout_s``."""
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        task = asyncio.current_task(loop)  # the loop given: no running-loop lookup (a getpid on 3.11; session 10)
        if task is None:
            raise RuntimeError("ReadDeadline.read must run in a task")
        self._task = task
        start = self._start = loop.time()
        self._reading = True
        due = start + self.timeout_s
        handle = self._handle
        if handle is None or due < self._armed_at:  # none yet, or this read's bound (timeout_s lowered) comes first
            if handle is not None:
                handle.cancel()
            self._armed_at = due
            self._handle = loop.call_at(due, self._fire)
        try:
            result = await work
        except asyncio.CancelledError:
            if self._expired:
                self._expired = False
                if task.uncancel() == 0:  # only ours
                    raise TimeoutError() from None
            raise
        finally:
            self._reading = False
        if self._expired:  # the read swallowed our cancellation: it still took too long (as asyncio.timeout)
            self._expired = False
            if task.uncancel() == 0:
                raise TimeoutError()
        return result

    def _fire(self) -> None:
        self._handle = None
        if not self._reading or self._task is None:
            return  # between reads: the next read arms a timer again
        due = self._start + self.timeout_s
        if self._loop is not None and self._loop.time() < due:
            self._armed_at = due
            self._handle = self._loop.call_at(due, self._fire)  # a later read: its own bound
            return
        self._expired = True
        self._task.cancel()

    def close(self) -> None:
        """Cancel the timer (call when the stream ends; idempotent)."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
