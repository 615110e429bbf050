"""Estimated time to first token: the request waits behind the replica's
queued prefill tokens ``q`` and then prefills its ``u`` uncached tokens:
``(q + u) / prefill_tokens_per_s`` seconds.

With ``calibrated`` (``cache_aware``'s ``calibrate``) and every candidate
calibrated (:mod:`routing.calibration`): ``(s + w_c · (q − s) + u) / r_c``
with the replica's learnt rate ``r_c`` and queue weight ``w_c`` in [0, 1]
and the shared wait ``s = min(q, k · u)`` (``k`` prefills in flight,
:meth:`routing.types.ReplicaLoad.shared_wait_tokens`): on a replica that
prefills one request at a time (``w_c`` = 1) the whole queue waits; where
concurrent prefills share the rate (chunked prefill, ``w_c`` = 0) each
prefill in flight delays the new one by at most the new one's own size."""

from __future__ import annotations

from collections.abc import Sequence

from routing.hashing import prefix_tokens
from routing.scorers._rates import rates_and_queue_weights
from routing.types import Candidate, RouteRequest

__all__ = ["EstimatedTTFTScorer"]


class EstimatedTTFTScorer:
    """Cost in seconds; ``prefill_tokens_per_s`` > 0 (raises :class:`ValueError`)."""

    name = "estimated_ttft"

    def __init__(self, prefill_tokens_per_s: float, calibrated: bool = False) -> None:
        if prefill_tokens_per_s <= 0:
            raise ValueError("prefill_tokens_per_s must be positive")
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.calibrated = calibrated

    def score(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        """``(queued prefill + uncached prompt tokens) / rate`` per candidate."""
        if self.calibrated:
            rw = rates_and_queue_weights(candidates, self.prefill_tokens_per_s, True)
            out = {}
            for c in candidates:
                rate, w = rw[c.replica_id]
                u = req.prompt_tokens - prefix_tokens(req, c.matched_blocks)
                s = c.load.shared_wait_tokens(u)
                out[c.replica_id] = (s + w * (c.load.queued_prefill_tokens - s) + u) / rate
            return out
        rate = self.prefill_tokens_per_s
        return {
            c.replica_id: (c.load.queued_prefill_tokens + (req.prompt_tokens - prefix_tokens(req, c.matched_blocks)))
            / rate
            for c in candidates
        }
