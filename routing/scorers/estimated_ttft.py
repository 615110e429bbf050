"""Estimated time to first token: the request waits behind the replica's
queued prefill tokens ``q`` and then prefills its ``u`` uncached tokens:
``(q + u) / prefill_tokens_per_s`` seconds."""

from __future__ import annotations

from collections.abc import Sequence

from routing.hashing import prefix_tokens
from routing.types import Candidate, RouteRequest

__all__ = ["EstimatedTTFTScorer"]


class EstimatedTTFTScorer:
    """Cost in seconds; ``prefill_tokens_per_s`` > 0 (raises :class:`ValueError`)."""

    name = "estimated_ttft"

    def __init__(self, prefill_tokens_per_s: float) -> None:
        if prefill_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s must be positive")
        self.prefill_tokens_per_s = prefill_tokens_per_s

    def score(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        """``(queued prefill + uncached prompt tokens) / rate`` per candidate."""
        rate = self.prefill_tokens_per_s
        return {
            c.replica_id: (c.load.queued_prefill_tokens + (req.prompt_tokens - prefix_tokens(req, c.matched_blocks)))
            / rate
            for c in candidates
        }
