"""``cache_aware``: estimated time to first token with a prefix-affinity
credit, under a bounded-load guard.

Chain: filters :class:`~routing.filters.dispatch_share.DispatchShareFilter`
(placements only; ``dispatch_share_factor: null`` drops it),
:class:`~routing.filters.load_guard.LoadGuardFilter` (a prefix holder within its
dispatch share is credited with the work its prefix saves, session 5) →
scorers :class:`~routing.scorers.estimated_ttft.EstimatedTTFTScorer`,
:class:`~routing.scorers.decode_load.DecodeLoadScorer`,
:class:`~routing.scorers.prefix_affinity.PrefixAffinityScorer` (and, opt-in,
:class:`~routing.scorers.queue_externality.QueueExternalityScorer`) → picker
:class:`~routing.pickers.lowest_cost.LowestCostPicker`; fallback
:class:`~routing.pickers.least_load.LeastLoadPicker` when the guard keeps
nobody (reason ``guard_fallback_least_load``).

For candidate ``c`` with ``m_c`` matched prefix tokens (from the index), the
request would prefill ``u_c = prompt_tokens - m_c`` tokens behind the
replica's queued prefill tokens ``q_c``; its cost (seconds) is
``(q_c + u_c) / prefill_tokens_per_s + decode_weight · decode_tokens_c /
prefill_tokens_per_s - prefix_weight · m_c / prefill_tokens_per_s``.
Lowest cost wins; guarded-out candidates report ``inf``.

Lineage: Dynamo's KV router costs new prefill blocks after overlap plus
active decode blocks; LMetric multiplies new prefill tokens by batch size;
llm-d sums weighted prefix/queue/kv-usage scorers; SGLang's cache-aware
router balances only past a fixed imbalance gate and otherwise follows a
match-ratio threshold. Here the trade is made on every request, and the
balance is enforced by a guard instead of a gate.

Defaults were tuned with ``sim/des.py`` on the Mooncake conversation trace
(2000 rows, 6 replicas; see ``bench/results/des_tuning.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from routing.filters.dispatch_share import DispatchShareFilter
from routing.filters.load_guard import LoadGuardFilter
from routing.params import PolicyParams
from routing.pickers.least_load import LeastLoadPicker
from routing.pickers.lowest_cost import LowestCostPicker
from routing.scheduler import Scheduler
from routing.scorers.decode_load import DecodeLoadScorer
from routing.scorers.estimated_ttft import EstimatedTTFTScorer
from routing.scorers.prefix_affinity import PrefixAffinityScorer
from routing.scorers.queue_externality import QueueExternalityScorer, externality_cost, work_equivalent_requests
from routing.types import Candidate, RouteChoice, RouteRequest

__all__ = ["CacheAwareConfig", "CacheAwarePolicy"]


class CacheAwareConfig(PolicyParams):
    """``routing.policy`` for cache-aware routing (docs/routing.md).

    Load guard: ``max_load_factor`` (>= 1, token bound over the mean),
    ``max_request_factor`` (>= 1, running-request bound; ``null``: same as
    ``max_load_factor``), ``slack_requests`` (>= 0, in units of this request's
    size), ``token_slack`` (>= 0, tokens), ``guard_tokens`` (apply the token
    bound). Scorers: ``prefill_tokens_per_s`` (> 0), ``prefix_weight`` (>= 0),
    ``decode_weight`` (>= 0), ``calibrate`` (use each replica's learnt rate and
    queue weight, :mod:`routing.calibration`, when the router has a
    calibration and every candidate is calibrated; otherwise the constant
    rate and a queue weight of 1). Picker: ``skip_blocks`` (>= 0, tie-break point).
    Dispatch-share guard (:mod:`routing.filters.dispatch_share`):
    ``dispatch_share_factor`` (>= 1, bound on a replica's share of the recent
    dispatches for placements; ``null``: off), ``dispatch_window_requests_per_replica``
    (>= 1, the sliding window per candidate replica),
    ``dispatch_share_reserve_next_turn`` (a placement leaves room for its own
    next turn; session 11, opt-in, default off).
    ``queue_externality_weight`` (>= 0; 0, the default, leaves the scorer out):
    :mod:`routing.scorers.queue_externality` (session 9, opt-in).
    ``queue_externality_work_balance`` (session 12, opt-in, default off; no effect at weight 0):
    the externality counts a replica's waiting requests at least as its share of the queued work
    (:func:`routing.scorers.queue_externality.work_equivalent_requests`).
    """

    name: Literal["cache_aware"] = "cache_aware"
    max_load_factor: float = Field(1.25, ge=1.0)
    max_request_factor: float | None = Field(2.0, ge=1.0)
    slack_requests: float = Field(4.0, ge=0)
    token_slack: float = Field(0.0, ge=0)
    prefix_weight: float = Field(16.0, ge=0)
    decode_weight: float = Field(0.0, ge=0)
    prefill_tokens_per_s: float = Field(10000.0, gt=0)
    guard_tokens: bool = True
    calibrate: bool = True
    skip_blocks: int = Field(1, ge=0)
    dispatch_share_factor: float | None = Field(1.2, ge=1.0)
    dispatch_window_requests_per_replica: int = Field(200, ge=1)
    dispatch_share_reserve_next_turn: bool = False
    queue_externality_weight: float = Field(0.0, ge=0)
    queue_externality_work_balance: bool = False


class CacheAwarePolicy(Scheduler):
    """The cache-aware chain (see module doc); ``scores`` are costs in seconds
    (``inf`` for candidates excluded by the load guard). Keyword parameters
    are those of :class:`CacheAwareConfig` (raises :class:`ValueError`)."""

    def __init__(self, config: CacheAwareConfig | None = None, /, **params: Any) -> None:
        cfg = self.config = config if config is not None else CacheAwareConfig(**params)
        rate = cfg.prefill_tokens_per_s
        request_factor = cfg.max_load_factor if cfg.max_request_factor is None else cfg.max_request_factor
        self.dispatch_share: DispatchShareFilter | None = None
        if cfg.dispatch_share_factor is not None:
            self.dispatch_share = DispatchShareFilter(cfg.dispatch_share_factor,
                                                      cfg.dispatch_window_requests_per_replica,
                                                      cfg.dispatch_share_reserve_next_turn)
        guard = LoadGuardFilter(
            request_factor=request_factor,
            token_factor=cfg.max_load_factor if cfg.guard_tokens else None,
            slack_requests=cfg.slack_requests,
            token_slack=cfg.token_slack,
            calibrated=cfg.calibrate,
            # session 5: a prefix holder within its dispatch share is credited with the work its prefix saves
            prefix_credit=self.dispatch_share.within_share if self.dispatch_share is not None else None,
        )
        self._own_scorers: tuple[Any, ...] = (EstimatedTTFTScorer(rate, cfg.calibrate),
                                              DecodeLoadScorer(cfg.decode_weight, rate, cfg.calibrate),
                                              PrefixAffinityScorer(cfg.prefix_weight, rate, cfg.calibrate))
        if cfg.queue_externality_weight > 0:
            self._own_scorers += (QueueExternalityScorer(cfg.queue_externality_weight, rate, cfg.calibrate,
                                                         cfg.queue_externality_work_balance),)
        filters: list[Any] = [guard]
        if self.dispatch_share is not None:
            filters.insert(0, self.dispatch_share)
        super().__init__(
            "cache_aware",
            filters=filters,
            scorers=self._own_scorers,
            picker=LowestCostPicker(cfg.skip_blocks),
            fallback=LeastLoadPicker(cfg.skip_blocks, "guard_fallback_least_load"),
            filtered_cost=math.inf,
        )
        self._own_chain = (self.filters, self.scorers, self.picker, self.fallback, self.filtered_cost)

    def _costs(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        """The three scorers' summed costs in one pass (one rate lookup instead of three dicts per
        scorer): per candidate the same floating-point operations, summed in the same order, as
        :meth:`routing.scheduler.Scheduler._costs` over :class:`EstimatedTTFTScorer`,
        :class:`DecodeLoadScorer`, :class:`PrefixAffinityScorer` (tests/routing/test_s6_route_cost.py)."""
        own = self._own_scorers
        ttft, decode, affinity, *extra = own
        rate0, calibrated = ttft.prefill_tokens_per_s, ttft.calibrated
        if self.scorers != own:
            return super()._costs(req, candidates)  # scorers replaced after construction
        for s in own:  # a loop, not any(genexpr): no generator frames (session 15)
            if s.prefill_tokens_per_s != rate0 or s.calibrated != calibrated:
                return super()._costs(req, candidates)  # scorers changed after construction
        ew = extra[0].weight if extra else 0.0
        waiting = work_equivalent_requests(candidates) if ew and extra[0].work_balance else None
        # rates_and_queue_weights(candidates, rate0, calibrated), inline: every candidate's own
        # estimate when calibrated and all have one, else (rate0, 1.0) for all
        own_rates = calibrated and len(candidates) > 0
        if own_rates:
            for c in candidates:
                e = c.estimate
                if e is None or not e.calibrated:
                    own_rates = False
                    break
        dw, aw = decode.weight, affinity.weight
        prompt, block = req.prompt_tokens, req.block_size
        out: dict[str, float] = {}
        rate, w = rate0, 1.0
        for c in candidates:
            rid, load = c.replica_id, c.load
            if own_rates:
                e = c.estimate
                rate, w = e.prefill_tokens_per_s, e.queue_weight  # type: ignore[union-attr]
            matched = max(0, min(c.matched_blocks * block, prompt))  # routing.hashing.prefix_tokens
            u = prompt - matched
            if calibrated:
                q = load.queued_prefill_tokens
                s = min(q, load.prefilling_requests * max(0, u))  # load.shared_wait_tokens(u), inline
                cost = (s + w * (q - s) + u) / rate
            else:
                cost = (load.queued_prefill_tokens + u) / rate
            cost += dw * load.decode_tokens / rate
            cost += -(aw * matched / rate)
            if ew:
                k = waiting[rid] if waiting is not None else load.prefilling_requests
                cost += externality_cost(ew, w, k, u, rate)
            out[rid] = cost
        return out

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate]) -> RouteChoice:
        """See :class:`routing.scheduler.Scheduler`; the pick is counted in
        the dispatch-share guard's window."""
        if len(candidates) == 1 and (self.filters, self.scorers, self.picker, self.fallback,
                                     self.filtered_cost) == self._own_chain:
            choice = self._choose_one(req, candidates)
        else:
            choice = super().choose(req, candidates)
        if self.dispatch_share is not None:
            self.dispatch_share.record(choice.replica_id)
        return choice

    def _choose_one(self, req: RouteRequest, cands: Sequence[Candidate]) -> RouteChoice:
        """:meth:`Scheduler.choose` of one candidate through this chain, without the generic steps
        (issue 14: one replica is common): the same filters, costs, reason and scores, the picker's
        rule written for one eligible candidate (it is its own best prefix) and the fallback's when the
        guard keeps nobody (tests/routing/test_s8_choose_one.py against the generic chain)."""
        c = cands[0]
        kept: Sequence[Candidate] = cands
        for f in self.filters:  # the dispatch-share filter keeps one candidate and resets its cap
            kept = f.filter(req, kept)
        scores = self._costs(req, cands)
        prompt, m = req.prompt_tokens, c.matched_blocks * req.block_size
        matched = max(0, m if m < prompt else prompt)  # prefix_tokens(req, c.matched_blocks), inline
        if kept:
            reason = "best_prefix" if c.matched_blocks > 0 else "no_prefix"
        else:
            scores[c.replica_id] = math.inf  # filtered_cost
            reason = self.fallback.pick(req, cands, cands, scores).reason  # type: ignore[union-attr]
        return RouteChoice(replica_id=c.replica_id, policy=self.name, predicted_prefix_tokens=matched,
                           available_prefix_tokens=matched, reason=reason, scores=scores)

    @property
    def load_factor(self) -> float:
        """Token-load bound relative to the mean (``max_load_factor``)."""
        return self.config.max_load_factor
