"""Dispatch-share guard: bounded loads on each replica's share of recent dispatches.

Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads"
(SODA 2018, arXiv 1608.01350) with capacity ``ceil(c · mean)``, applied to
the count of requests this router dispatched to each replica among its last
``window_per_replica · n`` dispatches (``n`` candidates; a sliding window, so
an old imbalance is forgotten).

A replica over its capacity is skipped **unless it is one of the request's
prefix holders** (the candidates with the longest match, when some candidate
matches less). So the guard acts on *placements*: new conversations (every
candidate matches alike) and requests the cost model would move off their
holder anyway (a long queue there); a follow-up turn is never taken away
from its history by this guard (the token and request guards of
:class:`routing.filters.load_guard.LoadGuardFilter` still bound it).

With ``reserve_next_turn`` (session 11, opt-in): a placement must leave room
for its own next turn, ``count + 2 <= cap`` instead of ``count + 1 <= cap``
(never below ``ceil(total / n)``, so the least-used candidate still fits):
the next turn of the conversation placed now will come to the same replica,
exempt as its prefix holder; a placement that fills a replica to exactly its
capacity makes that turn overshoot it (docs/routing.md, "Session 11").

Why: the cumulative request count per replica follows where conversations
were *placed* (their later turns follow them). Placements are most requests
of a conversation trace, and where they land is decided by small
differences of estimated TTFT (on replicas whose concurrent prefills share
the rate, a short new request costs about the same everywhere; learnt rates
differ by a few per cent), so they piled on a few replicas.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Sequence

from routing.types import Candidate, RouteRequest

__all__ = ["DispatchShareFilter", "placement_cap"]


def placement_cap(cap: int, total: int, n: int, reserve_next_turn: bool) -> int:
    """The count + 1 a placement may reach: ``cap`` (``ceil(factor · total / n)``), or with
    ``reserve_next_turn`` one less, but never below ``ceil(total / n)`` (the least-used of ``n``
    candidates sharing ``total - 1`` dispatches always fits). Counts of dispatches; ``n`` >= 1."""
    if not reserve_next_turn:
        return cap
    return max(cap - 1, -(-total // n))


class DispatchShareFilter:
    """Bounded share of recent dispatches, prefix holders exempt (module doc).

    ``factor`` >= 1 (``c``); ``window_per_replica`` >= 1 (dispatches
    remembered per candidate replica). :meth:`record` must be called with the
    replica each request went to (:class:`routing.policies.cache_aware.CacheAwarePolicy`
    does); ``reserve_next_turn`` (module doc, default off). Raises
    :class:`ValueError` out of range. Not thread-safe (one
    router, one event loop); per router instance (not shared between gateways)."""

    name = "dispatch_share"

    def __init__(self, factor: float, window_per_replica: int, reserve_next_turn: bool = False) -> None:
        if factor < 1.0:
            raise ValueError("dispatch share factor must be >= 1")
        if window_per_replica < 1:
            raise ValueError("dispatch window must be >= 1")
        self.factor = factor
        self.window_per_replica = window_per_replica
        self.reserve_next_turn = reserve_next_turn
        self._window = window_per_replica
        self._recent: deque[str] = deque()
        self._counts: Counter[str] = Counter()
        self._cap = math.inf

    def filter(self, req: RouteRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
        """The candidates whose recent count + 1 <= ``ceil(factor · (recent
        total over the candidates + 1) / n)`` (:func:`placement_cap` with
        ``reserve_next_turn``), plus the prefix holders (longest match, if some
        candidate matches less); order kept. Never empty when ``candidates`` is
        not: the least-used candidate always fits."""
        n = len(candidates)
        if n < 2:
            self._cap = math.inf
            return list(candidates)
        self._window = self.window_per_replica * n
        best = max(c.matched_blocks for c in candidates)
        holders = best > min(c.matched_blocks for c in candidates)
        counts = self._counts
        total = sum(counts[c.replica_id] for c in candidates) + 1
        cap = self._cap = math.ceil(self.factor * total / n)
        if self.reserve_next_turn:
            cap = placement_cap(cap, total, n, True)
        return [c for c in candidates
                if counts[c.replica_id] + 1 <= cap or (holders and c.matched_blocks == best)]

    def within_share(self, candidate: Candidate) -> bool:
        """True when ``candidate``'s recent count + 1 is within the cap of the
        last :meth:`filter` call (the same request's; the load guard runs
        after this filter). Used by ``cache_aware`` to give the load guard's
        prefix-saving credit only where the share bound has room."""
        return self._counts[candidate.replica_id] + 1 <= self._cap

    def record(self, replica_id: str) -> None:
        """Count one dispatch to ``replica_id``; the oldest beyond the window are forgotten."""
        self._recent.append(replica_id)
        self._counts[replica_id] += 1
        while len(self._recent) > self._window:
            old = self._recent.popleft()
            self._counts[old] -= 1
            if not self._counts[old]:
                del self._counts[old]

    def counts(self) -> dict[str, int]:
        """Recent dispatches per replica id (a copy)."""
        return dict(self._counts)
