"""Round robin: cycle over the eligible candidates sorted by id."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from routing.plugins import Pick
from routing.types import Candidate, RouteRequest

__all__ = ["RoundRobinPicker"]


class RoundRobinPicker:
    """One shared counter; reason ``rotation``. Stateful: one per policy."""

    name = "round_robin"

    def __init__(self) -> None:
        self._next = 0

    def pick(self, req: RouteRequest, candidates: Sequence[Candidate], eligible: Sequence[Candidate],
             scores: Mapping[str, float]) -> Pick:
        """The next candidate in id order."""
        ordered = sorted(eligible, key=lambda c: c.replica_id)
        chosen = ordered[self._next % len(ordered)]
        self._next += 1
        return Pick(chosen, "rotation")
