"""Token load: queued prefill + decode tokens in flight (tokens)."""

from __future__ import annotations

from collections.abc import Sequence

from routing.types import Candidate, RouteRequest

__all__ = ["TokenLoadScorer"]


class TokenLoadScorer:
    """Cost in tokens."""

    name = "token_load"

    def score(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        """Each candidate's token load."""
        return {c.replica_id: float(c.load.tokens) for c in candidates}
