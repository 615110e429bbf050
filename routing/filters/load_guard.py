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
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from routing.hashing import prefix_tokens
from routing.scorers._rates import rates_and_queue_weights
from routing.types import Candidate, RouteRequest

__all__ = ["LoadGuardFilter"]


class LoadGuardFilter:
    """Bounded-load filter (see module doc). ``request_factor`` >= 1;
    ``token_factor`` >= 1 or ``None`` (no token bound); ``slack_requests``,
    ``token_slack`` >= 0; ``calibrated``: weigh queued tokens by the learnt
    queue weight (module doc). Raises :class:`ValueError` out of range."""

    name = "load_guard"

    def __init__(
        self,
        request_factor: float,
        token_factor: float | None = None,
        slack_requests: float = 0.0,
        token_slack: float = 0.0,
        calibrated: bool = False,
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

    def filter(self, req: RouteRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
        """The candidates within both bounds, order kept (may be empty)."""
        if not candidates:
            return []
        n = len(candidates)
        running = {c.replica_id: c.load.running_requests + self._external(c) for c in candidates}
        total_req = sum(running.values()) + 1
        req_cap = math.ceil(self.request_factor * total_req / n)
        keep = [c for c in candidates if running[c.replica_id] + 1 <= req_cap]
        if self.token_factor is None or not keep:
            return keep
        uncached = {c.replica_id: req.prompt_tokens - prefix_tokens(req, c.matched_blocks) for c in candidates}
        load = self._token_loads(candidates, uncached)
        cost = min(uncached.values()) + req.max_tokens
        unit = max(1, req.prompt_tokens + req.max_tokens)
        mean = (sum(load.values()) + cost) / n
        tok_cap = math.ceil(self.token_factor * mean / unit) * unit
        tok_cap += self.slack_requests * unit + self.token_slack
        return [c for c in keep if load[c.replica_id] + uncached[c.replica_id] + req.max_tokens <= tok_cap]

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
