"""Prefix affinity: a credit of ``weight · matched_prefix_tokens /
prefill_tokens_per_s`` seconds (a negative cost).

A cached prefix also pays off for the conversation's *next* turns (moving a
conversation duplicates its history and evicts others), which a one-request
TTFT estimate ignores; the weight says how many turns' worth to count.
"""

from __future__ import annotations

from collections.abc import Sequence

from routing.hashing import prefix_tokens
from routing.scorers._rates import rates_and_queue_weights
from routing.types import Candidate, RouteRequest

__all__ = ["PrefixAffinityScorer"]


class PrefixAffinityScorer:
    """Cost in seconds (<= 0); ``weight`` >= 0, ``prefill_tokens_per_s`` > 0
    (raises :class:`ValueError`); ``calibrated``: per-candidate learnt rate
    when every candidate has one (:mod:`routing.calibration`)."""

    name = "prefix_affinity"

    def __init__(self, weight: float, prefill_tokens_per_s: float, calibrated: bool = False) -> None:
        if weight < 0 or prefill_tokens_per_s <= 0:
            raise ValueError("weight must be >= 0 and prefill_tokens_per_s positive")
        self.weight = weight
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.calibrated = calibrated

    def score(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        """Minus the weighted matched prefix, in seconds of prefill, per candidate."""
        rw = rates_and_queue_weights(candidates, self.prefill_tokens_per_s, self.calibrated)
        return {
            c.replica_id: -(self.weight * prefix_tokens(req, c.matched_blocks) / rw[c.replica_id][0])
            for c in candidates
        }
