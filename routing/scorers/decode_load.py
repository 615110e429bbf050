"""Decode load: ``weight · decode_tokens / prefill_tokens_per_s`` seconds, for
engines where decoding in flight slows the next prefill (0 turns it off)."""

from __future__ import annotations

from collections.abc import Sequence

from routing.scorers._rates import WeightedPrefillScorer
from routing.types import Candidate, RouteRequest

__all__ = ["DecodeLoadScorer"]


class DecodeLoadScorer(WeightedPrefillScorer):
    """Cost in seconds (see :class:`WeightedPrefillScorer`)."""

    name = "decode_load"

    def score(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        """Weighted decode tokens in flight, in seconds of prefill, per candidate."""
        rate = self.rates(candidates)
        return {c.replica_id: self.weight * c.load.decode_tokens / rate[c.replica_id] for c in candidates}
