"""Per-candidate prefill rate and queue weight, calibrated or configured."""

from __future__ import annotations

from collections.abc import Sequence

from routing.types import Candidate

__all__ = ["rates_and_queue_weights"]


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
