"""Session 16 (helper "routing"), a rejected candidate: the queue externality bounded by the request's own prefill.

``python -m bench.des_s16_routing_bounded [options of bench.des_s16_routing]`` adds rules
``bnd{F}_ext{W}`` / ``bnd{F}_wb_ext{W}`` (F 0.5, 1, 2; W 0.5, 1) to :mod:`bench.des_s16_routing`.
:class:`Bounded` is ``cache_aware`` with ``queue_externality_weight`` W whose externality may move a
request only to candidates whose cost *without* the externality is within ``F`` times the request's own
prefill (uncached tokens / rate at the cheapest candidate) of the cheapest: the longest prompts could
then wait at most that much longer than under the shipped rule. Result (docs/benchmarks.md, "Session
16: routing"): the bound takes away the median gain too; not shipped, not in routing/.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import bench.des_s16_routing as sweep
from routing.policies.cache_aware import CacheAwarePolicy
from routing.scorers.queue_externality import externality_cost, work_equivalent_requests
from routing.types import Candidate, RouteRequest

__all__ = ["Bounded", "main"]


class Bounded(CacheAwarePolicy):
    """``cache_aware`` (keyword parameters of :class:`routing.policies.cache_aware.CacheAwareConfig`) with
    the externality bounded by ``factor`` (>= 0) times the request's own prefill (module doc); costs in s."""

    def __init__(self, factor: float, **params: Any) -> None:
        super().__init__(**params)
        self.factor = factor

    def _costs(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        out = super()._costs(req, candidates)
        ew = self.config.queue_externality_weight
        if not ew or len(candidates) < 2:
            return out
        rate0 = self.config.prefill_tokens_per_s
        own = all(c.estimate is not None and c.estimate.calibrated for c in candidates)
        wb = work_equivalent_requests(candidates) if self.config.queue_externality_work_balance else None
        base: dict[str, float] = {}
        own_prefill: dict[str, float] = {}
        for c in candidates:
            rate, w = (c.estimate.prefill_tokens_per_s, c.estimate.queue_weight) if own else (rate0, 1.0)  # type: ignore[union-attr]
            u = req.prompt_tokens - max(0, min(c.matched_blocks * req.block_size, req.prompt_tokens))
            k = wb[c.replica_id] if wb is not None else c.load.prefilling_requests
            base[c.replica_id] = out[c.replica_id] - externality_cost(ew, w, k, u, rate)
            own_prefill[c.replica_id] = u / rate
        best = min(base, key=lambda rid: base[rid])
        bound = base[best] + self.factor * own_prefill[best]
        for rid in out:
            if base[rid] > bound:
                out[rid] = base[rid] + 1e6
        return out


def _factory(factor: float, weight: float, balance: bool) -> Any:
    return lambda model: Bounded(factor, queue_externality_weight=weight, queue_externality_work_balance=balance)


def main(argv: Sequence[str] | None = None) -> int:
    """Register the ``bnd*`` rules and run :func:`bench.des_s16_routing.main`."""
    for f in (0.5, 1.0, 2.0):
        for w, wb in ((0.5, False), (1.0, False), (1.0, True)):
            sweep.EXTRA_RULES[f"bnd{f:g}_{'wb_' if wb else ''}ext{w:g}"] = _factory(f, w, wb)
    return sweep.main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
