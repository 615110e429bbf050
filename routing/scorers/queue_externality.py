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
the longest prompts wait longer (p99 up).

Session 12 (opt-in, ``cache_aware``'s ``queue_externality_work_balance``): the waiting requests
``k_c`` are counted at least as the replica's share of the queued work
(:func:`work_equivalent_requests`), so the term cannot sort long prompts onto one replica past
its share of the work (docs/routing.md, "Session 12")."""

from __future__ import annotations

from collections.abc import Sequence

from routing.hashing import prefix_tokens
from routing.scorers._rates import WeightedPrefillScorer, rates_and_queue_weights
from routing.types import Candidate, RouteRequest

__all__ = ["QueueExternalityScorer", "externality_cost", "work_equivalent_requests"]


def externality_cost(weight: float, queue_weight: float, prefilling_requests: float, uncached_tokens: int,
                     rate: float) -> float:
    """``weight · queue_weight · max(0, prefilling_requests − 1) · uncached_tokens / rate``
    (seconds; tokens and tokens/s), the cost of the module doc."""
    return weight * (queue_weight * max(0, prefilling_requests - 1) * uncached_tokens) / rate


def work_equivalent_requests(candidates: Sequence[Candidate]) -> dict[str, float]:
    """Session 12 (``cache_aware``'s ``queue_externality_work_balance``): per candidate, the requests
    waiting there counted at least as the cluster would hold for its queued work,
    ``max(p_c, P̄ · q_c / Q̄)`` (``p_c`` prefilling requests, ``q_c`` queued prefill tokens, ``P̄``
    and ``Q̄`` their means over ``candidates``; ``p_c`` when ``Q̄`` is 0). Requests (floats).

    Why: the externality's stationary guess (the queue a request finds is the queue that forms
    behind it) holds for a replica that receives its share of the traffic; a replica that holds
    few but long prompts looks cheap to every further long prompt (few wait there), so the term
    sorts long prompts onto it without bound, and its queued work, and with it the longest
    prompts' wait (p99), grows past the others' (docs/routing.md, "Session 12": 116 of 2000
    requests, prefill busy max/mean 1.50). Size-interval task assignment with equal load
    (SITA-E; Harchol-Balter, Crovella, Murta, "On choosing a task assignment policy for a
    distributed server system", JPDC 1999) keeps that sorting and bounds it by the work each
    host gets: long jobs to some hosts, short to others, **equal load**. Counting a replica's
    queue by its work where that is the larger count makes a replica over its share of the work
    at least as costly to a long prompt as an average one, so the sorting stops at about equal
    work; a replica with many short requests is charged by its count, as before."""
    n = len(candidates)
    if n == 0:
        return {}
    mean_q = sum(c.load.queued_prefill_tokens for c in candidates) / n
    mean_p = sum(c.load.prefilling_requests for c in candidates) / n
    if mean_q <= 0:
        return {c.replica_id: float(c.load.prefilling_requests) for c in candidates}
    return {c.replica_id: max(float(c.load.prefilling_requests), mean_p * c.load.queued_prefill_tokens / mean_q)
            for c in candidates}


class QueueExternalityScorer(WeightedPrefillScorer):
    """Cost in seconds (module doc; parameters of :class:`WeightedPrefillScorer`); with
    ``work_balance`` (session 12, opt-in) the waiting requests are
    :func:`work_equivalent_requests`."""

    name = "queue_externality"

    def __init__(self, weight: float, prefill_tokens_per_s: float, calibrated: bool = False,
                 work_balance: bool = False) -> None:
        super().__init__(weight, prefill_tokens_per_s, calibrated)
        self.work_balance = work_balance

    def score(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        """:func:`externality_cost` per candidate."""
        rw = rates_and_queue_weights(candidates, self.prefill_tokens_per_s, self.calibrated)
        waiting = work_equivalent_requests(candidates) if self.work_balance else None
        out = {}
        for c in candidates:
            rate, w = rw[c.replica_id]
            u = req.prompt_tokens - prefix_tokens(req, c.matched_blocks)
            k = waiting[c.replica_id] if waiting is not None else c.load.prefilling_requests
            out[c.replica_id] = externality_cost(self.weight, w, k, u, rate)
        return out
