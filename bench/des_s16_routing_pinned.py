"""Session 16 (helper "routing"), a rejected candidate: an externality that counts pinned follow-up turns.

``python -m bench.des_s16_routing_pinned [options of bench.des_s16_routing]`` adds rules ``pin{W}``
(W 0.5, 1, 2) to :mod:`bench.des_s16_routing`. :class:`Pinned` is ``cache_aware`` plus, per candidate,
``W · w_c · H_c · u_c / r_c`` seconds: ``H_c`` the dispatches to ``c`` that were hits (predicted prefix
over half the prompt) among the last ``Q`` dispatches, ``Q`` the requests prefilling over all
candidates (the dispatches made while today's queues drain), so a long uncached prompt avoids the
replicas where follow-up turns, which cannot move without losing their cache, keep arriving (the
mechanism of docs/benchmarks.md, "Session 16: routing"). Result: it trades p99 for p50 like the queue
externality; not shipped, not in routing/.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Sequence
from typing import Any

import bench.des_s16_routing as sweep
from routing.policies.cache_aware import CacheAwarePolicy
from routing.types import Candidate, RouteChoice, RouteRequest

__all__ = ["Pinned", "main"]


class Pinned(CacheAwarePolicy):
    """``cache_aware`` (keyword parameters of :class:`routing.policies.cache_aware.CacheAwareConfig`) plus the
    pinned-turn externality of weight ``weight`` (>= 0; module doc); costs in s."""

    def __init__(self, weight: float, **params: Any) -> None:
        super().__init__(**params)
        self.pin_weight = weight
        self.recent: deque[tuple[str, bool]] = deque(maxlen=4096)

    def _costs(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        out = super()._costs(req, candidates)
        if len(candidates) < 2:
            return out
        q = sum(c.load.prefilling_requests for c in candidates)
        hits: dict[str, int] = {}
        for i, (rid, hit) in enumerate(reversed(self.recent)):
            if i >= q:
                break
            if hit:
                hits[rid] = hits.get(rid, 0) + 1
        own = all(c.estimate is not None and c.estimate.calibrated for c in candidates)
        for c in candidates:
            rate, w = (c.estimate.prefill_tokens_per_s, c.estimate.queue_weight) if own else (  # type: ignore[union-attr]
                self.config.prefill_tokens_per_s, 1.0)
            u = req.prompt_tokens - max(0, min(c.matched_blocks * req.block_size, req.prompt_tokens))
            out[c.replica_id] += self.pin_weight * w * hits.get(c.replica_id, 0) * u / rate
        return out

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate]) -> RouteChoice:
        """:meth:`CacheAwarePolicy.choose`, the pick remembered as a hit or not."""
        choice = super().choose(req, candidates)
        self.recent.append((choice.replica_id, choice.predicted_prefix_tokens > req.prompt_tokens // 2))
        return choice


def main(argv: Sequence[str] | None = None) -> int:
    """Register the ``pin*`` rules and run :func:`bench.des_s16_routing.main`."""
    for w in (0.5, 1.0, 2.0):
        sweep.EXTRA_RULES[f"pin{w:g}"] = (lambda w=w: lambda model: Pinned(w))()
    return sweep.main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
