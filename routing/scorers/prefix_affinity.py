"""Prefix affinity: a credit of ``weight · matched_prefix_tokens /
prefill_tokens_per_s`` seconds (a negative cost).

A cached prefix also pays off for the conversation's *next* turns (moving a
conversation duplicates its history and evicts others), which a one-request
TTFT estimate ignores; the weight says how many turns' worth to count.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.hashing import prefix_tokens
from routing.scorers._rates import WeightedPrefillScorer
from routing.types import Candidate, RouteRequest

__all__ = ["PrefixAffinityScorer"]


class PrefixAffinityScorer(WeightedPrefillScorer):
    """Cost in seconds (<= 0; see :class:`WeightedPrefillScorer`)."""

    name = "prefix_affinity"

    def score(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        """Minus the weighted matched prefix, in seconds of prefill, per candidate."""
        rate = self.rates(candidates)
        return {
            c.replica_id: -(self.weight * prefix_tokens(req, c.matched_blocks) / rate[c.replica_id])
            for c in candidates
        }
