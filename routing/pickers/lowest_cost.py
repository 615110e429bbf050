"""Lowest cost: the eligible candidate with the lowest summed score, then the
most matched blocks, then rendezvous hash of block ``skip_blocks``, then id.

Reasons: ``best_prefix`` (the chosen one holds the longest prefix),
``load_guard`` (a longer prefix was filtered out), ``queue_tradeoff`` (a
longer prefix was eligible but cost more), ``no_prefix``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from routing.hashing import request_point, tiebreak
from routing.plugins import Pick
from routing.types import Candidate, RouteRequest

__all__ = ["LowestCostPicker"]


class LowestCostPicker:
    """See module doc. ``skip_blocks`` >= 0 (raises :class:`ValueError`)."""

    name = "lowest_cost"

    def __init__(self, skip_blocks: int = 1) -> None:
        if skip_blocks < 0:
            raise ValueError("skip_blocks must be >= 0")
        self.skip_blocks = skip_blocks

    def pick(self, req: RouteRequest, candidates: Sequence[Candidate], eligible: Sequence[Candidate],
             scores: Mapping[str, float]) -> Pick:
        """The cheapest of ``eligible`` and why (see module doc)."""
        if len(eligible) == 1:  # min() of one element: no key (no rendezvous hash) needed
            chosen = eligible[0]
        else:
            chosen = self._cheapest(req, eligible, scores)
        best = max(c.matched_blocks for c in candidates)
        kept = {c.replica_id for c in eligible}
        if chosen.matched_blocks == best and best > 0:
            reason = "best_prefix"
        elif best > 0 and any(c.matched_blocks == best for c in candidates if c.replica_id not in kept):
            reason = "load_guard"
        elif chosen.matched_blocks < best:
            reason = "queue_tradeoff"
        else:
            reason = "no_prefix"
        return Pick(chosen, reason)

    def _cheapest(self, req: RouteRequest, eligible: Sequence[Candidate], scores: Mapping[str, float]) -> Candidate:
        """``min(eligible)`` by (score, -matched blocks, rendezvous hash, id), the hash computed only
        for the candidates tied on the first two (session 6, issue 14: usually none); a NaN score
        (no total order) takes the one full-key ``min`` of before, whose answer then depends on order."""
        best: tuple[float, int] | None = None
        tied: list[Candidate] = []
        for c in eligible:
            s = scores[c.replica_id]
            if s != s:
                tied = []
                break
            k = (s, -c.matched_blocks)
            if best is None or k < best:
                best = k
                tied = [c]
            elif k == best:
                tied.append(c)
        if len(tied) == 1:
            return tied[0]
        point = request_point(req, self.skip_blocks)
        if not tied:  # a NaN score
            return min(eligible, key=lambda c: (scores[c.replica_id], -c.matched_blocks, tiebreak(point, c.replica_id),
                                                c.replica_id))
        return min(tied, key=lambda c: (tiebreak(point, c.replica_id), c.replica_id))
