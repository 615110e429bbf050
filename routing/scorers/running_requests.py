"""Running requests: requests dispatched to the replica and not finished."""

from __future__ import annotations

from collections.abc import Sequence

from routing.types import Candidate, RouteRequest

__all__ = ["RunningRequestsScorer"]


class RunningRequestsScorer:
    """Cost in requests."""

    name = "running_requests"

    def score(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        """Each candidate's running requests."""
        return {c.replica_id: float(c.load.running_requests) for c in candidates}
