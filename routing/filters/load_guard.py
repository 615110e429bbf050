"""Load guard: consistent hashing with bounded loads, in requests and tokens.

Mirrokni, Thorup, Zadimoghaddam, "Consistent Hashing with Bounded Loads"
(SODA 2018, arXiv 1608.01350). Means are over the filter's input candidates
*including* this request, so an idle cluster still routes. A candidate is
kept only if, after taking the request,

* its running requests ``<= ceil(request_factor · mean)``, and
* (when ``token_factor`` is set) its token load (queued prefill + decode
  tokens, plus this request's uncached prompt and ``max_tokens``)
  ``<= ceil(token_factor · mean / unit) · unit + slack_requests · unit +
  token_slack`` with ``unit = prompt_tokens + max_tokens`` (the token
  analogue of Mirrokni's ceil: a replica holding only this request is always
  kept); the slack, in units of this request's size, keeps a lightly loaded
  cluster sticky where a few requests in flight make the relative bound
  meaningless. The token mean counts this request at its cheapest placement.

With ``calibrated`` (``cache_aware``'s ``calibrate``) and every candidate
calibrated, a candidate's queued prefill tokens count only as far as they
would delay this request (its learnt queue weight, :mod:`routing.calibration`):
the slack a replica gets is derived from how it is seen to prefill. Its
running requests then also count the requests its engine reported beyond
this router's own (``ReplicaEstimate.external_requests``: other clients).

With ``prefix_credit`` (``cache_aware``, session 5: the candidates within
their dispatch share,
:meth:`routing.filters.dispatch_share.DispatchShareFilter.within_share`), a
candidate it accepts is credited with the work its cached prefix saves:
``saved`` = its matched prompt tokens minus those of the least-matching
candidate (the tokens a move elsewhere would
add to the cluster's work, and the duplicate blocks it would make some
replica hold), ``f = saved / unit``. Its request bound's deviation from the
mean is scaled by ``1 / (1 - f)`` (``running + 1 <= ceil((1 + (request_factor
- 1) / (1 - f)) · mean)``) and its token load after the request is counted
without ``saved``. A candidate that saves nothing is held to the bounds as
before, so placements (every candidate matches alike) are unchanged, and so
is a candidate ``prefix_credit`` refuses (over its share of recent
dispatches: the credit may not push a replica's request count past the share
bound); a follow-up turn whose history saves most of its work is no longer
taken from it by a bound of a few requests at light load (docs/routing.md,
"Prefix-saving load guard").
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from routing.hashing import prefix_tokens
from routing.scorers._rates import rates_and_queue_weights
from routing.types import Candidate, RouteRequest

__all__ = ["LoadGuardFilter"]


class LoadGuardFilter:
    """Bounded-load filter (see module doc). ``request_factor`` >= 1;
    ``token_factor`` >= 1 or ``None`` (no token bound); ``slack_requests``,
    ``token_slack`` >= 0; ``calibrated``: weigh queued tokens by the learnt
    queue weight (module doc); ``prefix_credit``: which candidates get the
    prefix-saving credit (module doc; ``None``: none). Raises
    :class:`ValueError` out of range."""

    name = "load_guard"

    def __init__(
        self,
        request_factor: float,
        token_factor: float | None = None,
        slack_requests: float = 0.0,
        token_slack: float = 0.0,
        calibrated: bool = False,
        prefix_credit: Callable[[Candidate], bool] | None = None,
    ) -> None:
        if request_factor < 1.0 or (token_factor is not None and token_factor < 1.0):
            raise ValueError("load factors must be >= 1")
        if slack_requests < 0 or token_slack < 0:
            raise ValueError("slack must be >= 0")
        self.request_factor = request_factor
        self.token_factor = token_factor
        self.slack_requests = slack_requests
        self.token_slack = token_slack
        self.calibrated = calibrated
        self.prefix_credit = prefix_credit

    def filter(self, req: RouteRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
        """The candidates within both bounds, order kept (may be empty)."""
        if not candidates:
            return []
        n = len(candidates)
        if n == 1:
            return self._one(req, candidates[0])
        uncached = {c.replica_id: req.prompt_tokens - prefix_tokens(req, c.matched_blocks) for c in candidates}
        unit = max(1, req.prompt_tokens + req.max_tokens)
        worst = max(uncached.values())
        credit = self.prefix_credit
        saved = {c.replica_id: worst - uncached[c.replica_id] if credit is not None and credit(c) else 0
                 for c in candidates}
        running = {c.replica_id: c.load.running_requests + self._external(c) for c in candidates}
        mean_req = (sum(running.values()) + 1) / n
        keep = [c for c in candidates
                if running[c.replica_id] + 1 <= self._request_cap(saved[c.replica_id] / unit, mean_req)]
        if self.token_factor is None or not keep:
            return keep
        load = self._token_loads(candidates, uncached)
        cost = min(uncached.values()) + req.max_tokens
        mean = (sum(load.values()) + cost) / n
        tok_cap = math.ceil(self.token_factor * mean / unit) * unit
        tok_cap += self.slack_requests * unit + self.token_slack
        return [c for c in keep
                if load[c.replica_id] + uncached[c.replica_id] + req.max_tokens - saved[c.replica_id] <= tok_cap]

    def _one(self, req: RouteRequest, c: Candidate) -> list[Candidate]:
        """:meth:`filter` of one candidate, the same operations without the per-id dicts: it is
        its own least-matching candidate (it saves nothing) and the sums are of one term. Session 15:
        :func:`prefix_tokens`, :meth:`_external`, :meth:`_request_cap` (a saved fraction of 0) and the
        load's properties written inline (no frame each; tests/routing/test_s15_route_equivalence.py)."""
        prompt, load_ = req.prompt_tokens, c.load
        m = c.matched_blocks * req.block_size
        uncached = prompt - max(0, m if m < prompt else prompt)  # prefix_tokens(req, c.matched_blocks)
        unit = max(1, prompt + req.max_tokens)
        est = c.estimate
        # _external(c): the engine's requests beyond this router's own (calibrated only)
        running = load_.running_requests + (est.external_requests if self.calibrated and est is not None else 0.0)
        if not running + 1 <= math.ceil(self.request_factor * ((0 + running + 1) / 1)):  # _request_cap(0, mean)
            return []
        if self.token_factor is None:
            return [c]
        # _token_loads of one candidate (rates_and_queue_weights: its own estimate or 1.0)
        w = est.queue_weight if self.calibrated and est is not None and est.calibrated else 1.0
        if w >= 1.0:
            load = load_.queued_prefill_tokens + load_.decode_tokens  # ReplicaLoad.tokens
        else:
            q = load_.queued_prefill_tokens
            s = min(q, load_.prefilling_requests * max(0, uncached))  # ReplicaLoad.shared_wait_tokens
            load = s + w * (q - s) + load_.decode_tokens
        mean = (0 + load + (uncached + req.max_tokens)) / 1
        tok_cap = math.ceil(self.token_factor * mean / unit) * unit
        tok_cap += self.slack_requests * unit + self.token_slack
        return [c] if load + uncached + req.max_tokens - 0 <= tok_cap else []

    def _request_cap(self, saved_fraction: float, mean: float) -> float:
        """``ceil(factor · mean)`` running requests, ``factor`` = ``request_factor``
        with its deviation from 1 scaled by ``1 / (1 - f)`` (``f`` in [0, 1),
        the fraction of the request's work the candidate's prefix saves; ``f =
        1``, a prompt wholly cached and ``max_tokens`` 0, has no bound)."""
        if saved_fraction <= 0:
            return math.ceil(self.request_factor * mean)
        if saved_fraction >= 1:
            return math.inf
        return math.ceil((1 + (self.request_factor - 1) / (1 - saved_fraction)) * mean)

    def _external(self, c: Candidate) -> float:
        """Requests the replica's engine reported beyond this router's own
        (``calibrated`` only; 0 without an engine sample)."""
        if not self.calibrated or c.estimate is None:
            return 0.0
        return c.estimate.external_requests

    def _token_loads(self, candidates: Sequence[Candidate], uncached: dict[str, int]) -> dict[str, float]:
        """Token load per candidate: queued prefill + decode tokens; with
        ``calibrated`` and every candidate calibrated, only the queued tokens
        that would delay this request count (``s + w · (q − s)``, as in
        :mod:`routing.scorers.estimated_ttft`), so a replica whose prefills
        share its rate is not held to a FIFO queue it does not have."""
        rw = rates_and_queue_weights(candidates, 1.0, self.calibrated)
        out: dict[str, float] = {}
        for c in candidates:
            w = rw[c.replica_id][1]
            if w >= 1.0:
                out[c.replica_id] = c.load.tokens
                continue
            s = c.load.shared_wait_tokens(uncached[c.replica_id])
            out[c.replica_id] = s + w * (c.load.queued_prefill_tokens - s) + c.load.decode_tokens
        return out
