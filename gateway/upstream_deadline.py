"""One loop timer for the first-byte deadlines of all upstream calls of a pool (issue 14, session 8).

Why: ``asyncio.timeout`` around each upstream call costs ~3 µs of CPU in a warm
loop and ~6 µs in the gateway's upstream path (a ``Timeout`` object, a timer
handle scheduled and cancelled, the task's cancel/uncancel bookkeeping;
bench/upstream_clients.py, docs/benchmarks.md "Session 8: upstream path").
Nearly every call ends long before its deadline, and the deadlines of one
pool arrive in rising order (each is "now + the same budget"), so one timer
set at the earliest pending deadline serves them all: registering a call is
a dict insert, ending it a dict pop; the timer is moved only when a call
comes with an earlier deadline than the one it is set for.

When the timer fires, every registered item whose deadline is reached
(within :data:`SLACK_S`) is removed and its ``expire()`` called; the timer
is then set at the earliest deadline left, if any. An item is expired at
most once and never after :meth:`DeadlineWatch.discard`.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Protocol

__all__ = ["DeadlineWatch", "Expiring", "SLACK_S"]

#: a deadline this close to the loop's clock counts as reached (uvloop's clock and timers
#: have millisecond resolution: its timer may fire up to ~1 ms before ``when``, as
#: ``asyncio.timeout``'s own timer does there)
SLACK_S = 0.001

log = logging.getLogger("prefixgate")


class Expiring(Protocol):
    """What :class:`DeadlineWatch` watches: ``expire()`` is called once when its deadline passes."""

    def expire(self) -> None: ...  # noqa: D102


class DeadlineWatch:
    """Deadlines (loop time, seconds) of many items on one ``loop.call_at`` timer.

    Use from the event loop's thread. ``pending``: items registered and not yet expired nor
    discarded. An ``expire()`` that raises is logged and not retried; the others still run.
    """

    __slots__ = ("_items", "_timer", "_at")

    def __init__(self) -> None:
        self._items: dict[Expiring, float] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._at = math.inf

    @property
    def pending(self) -> int:
        """Items registered and not yet expired nor discarded."""
        return len(self._items)

    def add(self, item: Expiring, deadline: float, loop: asyncio.AbstractEventLoop) -> None:
        """Call ``item.expire()`` once ``loop.time()`` reaches ``deadline`` (unless discarded first)."""
        self._items[item] = deadline
        if deadline < self._at:
            self._arm(deadline, loop)

    def discard(self, item: Expiring) -> None:
        """Forget ``item`` (no error if it is not there). The timer stays set: it moves on when it fires."""
        self._items.pop(item, None)

    def close(self) -> None:
        """Forget every item and stop the timer (nothing expires afterwards)."""
        self._items.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._at = math.inf

    def _arm(self, when: float, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._at = when
        self._timer = loop.call_at(when, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer, self._at = None, math.inf
        reached = loop.time() + SLACK_S
        expired = [item for item, deadline in self._items.items() if deadline <= reached]
        for item in expired:
            del self._items[item]
        if self._items:
            self._arm(min(self._items.values()), loop)
        for item in expired:
            try:
                item.expire()
            except Exception:  # one item's failure must not keep the others from expiring
                log.exception("an upstream deadline's expiry failed")
