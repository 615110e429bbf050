"""Least load: fewest token load (queued prefill + decode tokens), then fewest
running requests, then rendezvous hash of block ``skip_blocks``, then id."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from routing.hashing import request_point, tiebreak
from routing.plugins import Pick
from routing.types import Candidate, RouteRequest

__all__ = ["LeastLoadPicker"]


class LeastLoadPicker:
    """Picks on the load itself (ignores the scores); answers ``reason``.
    ``skip_blocks`` >= 0 (raises :class:`ValueError`)."""

    name = "least_load"

    def __init__(self, skip_blocks: int = 0, reason: str = "min_token_load") -> None:
        if skip_blocks < 0:
            raise ValueError("skip_blocks must be >= 0")
        self.skip_blocks = skip_blocks
        self.reason = reason

    def pick(self, req: RouteRequest, candidates: Sequence[Candidate], eligible: Sequence[Candidate],
             scores: Mapping[str, float]) -> Pick:
        """The least loaded of ``eligible``."""
        if len(eligible) == 1:  # min() of one element: no key (no rendezvous hash) needed
            return Pick(eligible[0], self.reason)
        point = request_point(req, self.skip_blocks)
        chosen = min(
            eligible,
            key=lambda c: (c.load.tokens, c.load.running_requests, tiebreak(point, c.replica_id), c.replica_id),
        )
        return Pick(chosen, self.reason)
