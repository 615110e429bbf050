"""Decode load: ``weight · decode_tokens / prefill_tokens_per_s`` seconds, for
engines where decoding in flight slows the next prefill (0 turns it off)."""

from __future__ import annotations

from collections.abc import Sequence

from routing.types import Candidate, RouteRequest

__all__ = ["DecodeLoadScorer"]


class DecodeLoadScorer:
    """Cost in seconds; ``weight`` >= 0, ``prefill_tokens_per_s`` > 0
    (raises :class:`ValueError`)."""

    name = "decode_load"

    def __init__(self, weight: float, prefill_tokens_per_s: float) -> None:
        if weight < 0 or prefill_tokens_per_s <= 0:
            raise ValueError("weight must be >= 0 and prefill_tokens_per_s positive")
        self.weight = weight
        self.prefill_tokens_per_s = prefill_tokens_per_s

    def score(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        """Weighted decode tokens in flight, in seconds of prefill, per candidate."""
        return {c.replica_id: self.weight * c.load.decode_tokens / self.prefill_tokens_per_s for c in candidates}
