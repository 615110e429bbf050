"""Per-candidate prefill rate and queue weight, calibrated or configured."""

from __future__ import annotations

from collections.abc import Sequence

from routing.types import Candidate

__all__ = ["WeightedPrefillScorer", "rates_and_queue_weights"]


def rates_and_queue_weights(candidates: Sequence[Candidate], rate: float, calibrated: bool
                            ) -> dict[str, tuple[float, float]]:
    """``{id: (tokens/s, queue weight)}``: each candidate's calibrated
    estimate when ``calibrated`` is set and *every* candidate has one (a
    partly calibrated set would mix units: the configured constant is a
    nominal figure, the estimates are in the router's own tokens per second);
    otherwise ``(rate, 1.0)`` for all (one prefill at a time)."""
    if calibrated and candidates and all(c.estimate is not None and c.estimate.calibrated for c in candidates):
        return {c.replica_id: (c.estimate.prefill_tokens_per_s, c.estimate.queue_weight)  # type: ignore[union-attr]
                for c in candidates}
    return {c.replica_id: (rate, 1.0) for c in candidates}


class WeightedPrefillScorer:
    """Base of the scorers that weigh a token count by seconds of prefill: ``weight`` >= 0,
    ``prefill_tokens_per_s`` > 0 (raises :class:`ValueError`); ``calibrated``: each
    candidate's learnt rate when every candidate has one (:mod:`routing.calibration`)."""

    def __init__(self, weight: float, prefill_tokens_per_s: float, calibrated: bool = False) -> None:
        if weight < 0 or prefill_tokens_per_s <= 0:
            raise ValueError("weight must be >= 0 and prefill_tokens_per_s positive")
        self.weight = weight
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.calibrated = calibrated

    def rates(self, candidates: Sequence[Candidate]) -> dict[str, float]:
        """``{id: prefill tokens/s}`` to weigh with (see :func:`rates_and_queue_weights`)."""
        rw = rates_and_queue_weights(candidates, self.prefill_tokens_per_s, self.calibrated)
        return {rid: r for rid, (r, _) in rw.items()}
