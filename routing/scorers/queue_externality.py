"""Queue externality (session 9, opt-in): the delay a request's own prefill adds to the requests
that will wait behind it on a replica that prefills one request at a time.

System-optimal routing (Beckmann, McGuire, Winsten 1956; the marginal-cost tolls of selfish
routing) charges each request its own latency **plus** what it adds to everyone else's. On a FIFO
replica a request of ``u`` uncached tokens delays every request queued after it by ``u / r_c``;
how many will queue after it is unknown at dispatch, and the expected count is taken as the
queue it finds (a stationary queue looks alike to an arrival and a departure): the ``k_c =
prefilling_requests − 1`` requests dispatched to ``c`` and still waiting behind the one in
progress. The cost is

    weight · w_c · k_c · u_c / r_c   seconds

with the replica's queue weight ``w_c`` (≈ 1 FIFO, ≈ 0 where concurrent prefills share the
rate: there nobody queues behind; 1 uncalibrated) and rate ``r_c``
(:func:`routing.scorers._rates.rates_and_queue_weights`). ``weight`` 1 is the marginal cost
itself; 0 (``cache_aware``'s default) leaves the term out of the chain.

Effect (docs/routing.md, "Session 9"): a long uncached prompt goes where few requests wait, short
ones may join longer queues of short requests; the mean and the median TTFT fall under overload,
the longest prompts wait longer (p99 up)."""

from __future__ import annotations

from collections.abc import Sequence

from routing.hashing import prefix_tokens
from routing.scorers._rates import WeightedPrefillScorer, rates_and_queue_weights
from routing.types import Candidate, RouteRequest

__all__ = ["QueueExternalityScorer", "externality_cost"]


def externality_cost(weight: float, queue_weight: float, prefilling_requests: int, uncached_tokens: int,
                     rate: float) -> float:
    """``weight · queue_weight · max(0, prefilling_requests − 1) · uncached_tokens / rate``
    (seconds; tokens and tokens/s), the cost of the module doc."""
    return weight * (queue_weight * max(0, prefilling_requests - 1) * uncached_tokens) / rate


class QueueExternalityScorer(WeightedPrefillScorer):
    """Cost in seconds (module doc; parameters of :class:`WeightedPrefillScorer`)."""

    name = "queue_externality"

    def score(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        """:func:`externality_cost` per candidate."""
        rw = rates_and_queue_weights(candidates, self.prefill_tokens_per_s, self.calibrated)
        out = {}
        for c in candidates:
            rate, w = rw[c.replica_id]
            u = req.prompt_tokens - prefix_tokens(req, c.matched_blocks)
            out[c.replica_id] = externality_cost(self.weight, w, c.load.prefilling_requests, u, rate)
        return out
