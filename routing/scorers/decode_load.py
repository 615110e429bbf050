"""Decode load: ``weight · decode_tokens / prefill_tokens_per_s`` seconds, for
engines where decoding in flight slows the next prefill (0 turns it off)."""

from __future__ import annotations

from collections.abc import Sequence

from routing.scorers._rates import rates_and_queue_weights
from routing.types import Candidate, RouteRequest

__all__ = ["DecodeLoadScorer"]


class DecodeLoadScorer:
    """Cost in seconds; ``weight`` >= 0, ``prefill_tokens_per_s`` > 0
    (raises :class:`ValueError`); ``calibrated``: per-candidate learnt rate
    when every candidate has one (:mod:`routing.calibration`)."""

    name = "decode_load"

    def __init__(self, weight: float, prefill_tokens_per_s: float, calibrated: bool = False) -> None:
        if weight < 0 or prefill_tokens_per_s <= 0:
            raise ValueError("weight must be >= 0 and prefill_tokens_per_s positive")
        self.weight = weight
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.calibrated = calibrated

    def score(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        """Weighted decode tokens in flight, in seconds of prefill, per candidate."""
        rw = rates_and_queue_weights(candidates, self.prefill_tokens_per_s, self.calibrated)
        return {c.replica_id: self.weight * c.load.decode_tokens / rw[c.replica_id][0] for c in candidates}
