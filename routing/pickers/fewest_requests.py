"""Fewest running requests, then id (a last-resort fallback)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from routing.plugins import Pick
from routing.types import Candidate, RouteRequest

__all__ = ["FewestRequestsPicker"]


class FewestRequestsPicker:
    """Picks on running requests; answers ``reason``."""

    name = "fewest_requests"

    def __init__(self, reason: str = "fewest_requests") -> None:
        self.reason = reason

    def pick(self, req: RouteRequest, candidates: Sequence[Candidate], eligible: Sequence[Candidate],
             scores: Mapping[str, float]) -> Pick:
        """The eligible candidate with the fewest running requests."""
        chosen = min(eligible, key=lambda c: (c.load.running_requests, c.replica_id))
        return Pick(chosen, self.reason)
