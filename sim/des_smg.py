"""An imitation of smg 1.13's ``cache_aware`` rule for the offline simulation (session 9).

:class:`SMGLikePolicy` follows what ``python -m smg.launch_router --help``
(smg 1.13.0, the router ``sim.grid`` runs beside PrefixGate) documents for
its defaults, on the router's own view of each replica:

* **worker overload protection** (on by default): a replica whose engine
  reports at least ``overload_waiting`` (8) *waiting* requests is left out
  while another replica is under it; when every replica is over it, all
  stay candidates (no shedding by default). Waiting requests are those
  dispatched and not yet prefilling: on a one-prefill-at-a-time (``fifo``)
  replica, the prefilling requests minus the one in progress; on a
  ``chunked`` replica, none (every request prefills at once);
* **cache match** (``cache_threshold`` 0.3): if the best match covers more
  than that share of the prompt, the best-matching candidate is taken
  (fewest running requests among equal matches), unless the **spill gate**
  trips: its running requests exceed the candidates' mean by the margin
  ``min(balance_abs_threshold, max(min(4, balance_abs_threshold), 2·√mean))``
  (the in-flight count's natural swing, as documented) **and** exceed
  ``balance_rel_threshold`` (1.5) times the mean; then the least loaded;
* otherwise (a miss) the candidate with the fewest running requests.

Not modelled: the warm-up slice for new workers, wedge and stall detection,
KV-usage gates (off by default) and the real radix tree (the gateway's
prefix index stands in, as for :class:`sim.des.SGLangLikePolicy`). On the
grid's 500 rows the imitation lands close to smg over HTTP: TTFT p50 / p99
1.89 / 15.6 s against smg's 2.02 / 15.8 in the default cell, 19.9 / 63.7
against 17.9 / 57.1 at prefill x0.5 (docs/benchmarks.md, "Session 9:
routing under overload").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from routing.plugins import make_choice, require_candidates
from routing.types import Candidate, RouteChoice, RouteRequest

__all__ = ["SMGLikePolicy"]


class SMGLikePolicy:
    """smg 1.13 ``cache_aware`` imitation (module doc).

    ``replica_model``: ``fifo`` or ``chunked`` (how waiting requests are
    read from the load view); raises :class:`ValueError` otherwise or on a
    negative threshold."""

    name = "smg_like"

    def __init__(self, replica_model: str = "fifo", *, cache_threshold: float = 0.3,
                 balance_abs_threshold: float = 64.0, balance_rel_threshold: float = 1.5,
                 overload_waiting: int | None = 8) -> None:
        if replica_model not in ("fifo", "chunked"):
            raise ValueError("replica_model must be fifo or chunked")
        if cache_threshold < 0 or balance_abs_threshold < 0 or balance_rel_threshold < 1:
            raise ValueError("thresholds must be >= 0 (relative >= 1)")
        if overload_waiting is not None and overload_waiting < 1:
            raise ValueError("overload_waiting must be >= 1 or None")
        self.replica_model = replica_model
        self.cache_t = cache_threshold
        self.abs_t = balance_abs_threshold
        self.rel_t = balance_rel_threshold
        self.overload_waiting = overload_waiting

    def waiting(self, c: Candidate) -> int:
        """Requests waiting to start prefill on ``c`` as its engine would report them."""
        if self.replica_model == "chunked":
            return 0
        return max(0, c.load.prefilling_requests - 1)

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate]) -> RouteChoice:
        """See :class:`routing.policies.RoutingPolicy`."""
        require_candidates(candidates)
        cands: Sequence[Candidate] = candidates
        if self.overload_waiting is not None:
            cands = [c for c in candidates if self.waiting(c) < self.overload_waiting] or candidates
        loads = {c.replica_id: float(c.load.running_requests) for c in candidates}
        mean = sum(loads.values()) / len(loads)
        least = min(cands, key=lambda c: (c.load.running_requests, c.replica_id))
        best = max(cands, key=lambda c: (c.matched_blocks, -c.load.running_requests, c.replica_id))
        ratio = min(best.matched_blocks * req.block_size, req.prompt_tokens) / max(1, req.prompt_tokens)
        if ratio <= self.cache_t:
            return make_choice(self.name, req, candidates, least, "min_load", loads)
        margin = min(self.abs_t, max(min(4.0, self.abs_t), 2.0 * math.sqrt(mean)))
        load = best.load.running_requests
        if load > mean + margin and load > self.rel_t * mean:
            return make_choice(self.name, req, candidates, least, "spill", loads)
        return make_choice(self.name, req, candidates, best, "cache_match", loads)
