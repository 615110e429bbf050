"""The chain that turns plugins into a policy: filter → score → pick."""

from __future__ import annotations

from collections.abc import Sequence

from routing.plugins import Filter, Picker, Scorer, make_choice, require_candidates
from routing.types import Candidate, NoCandidateError, RouteChoice, RouteRequest

__all__ = ["Scheduler"]


class Scheduler:
    """A :class:`routing.plugins.RoutingPolicy` made of plugins.

    ``filters`` run in order, each on the previous one's output;
    ``scorers`` score *all* candidates and their costs are summed in order
    (no scorer: cost 0.0); when ``filtered_cost`` is set, filtered-out
    candidates get that cost in the reported scores (e.g. ``inf``);
    ``picker`` picks among the eligible candidates, ``fallback`` among all of
    them when the filters left none (no fallback: :class:`NoCandidateError`).
    """

    def __init__(
        self,
        name: str,
        *,
        picker: Picker,
        filters: Sequence[Filter] = (),
        scorers: Sequence[Scorer] = (),
        fallback: Picker | None = None,
        filtered_cost: float | None = None,
    ) -> None:
        self.name = name
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.picker = picker
        self.fallback = fallback
        self.filtered_cost = filtered_cost

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate]) -> RouteChoice:
        """See :class:`routing.plugins.RoutingPolicy`; ``scores`` are the summed costs."""
        require_candidates(candidates)
        eligible: Sequence[Candidate] = candidates
        for f in self.filters:
            eligible = f.filter(req, eligible)
        scores = self._costs(req, candidates)
        if self.filtered_cost is not None and len(eligible) != len(candidates):
            kept = {c.replica_id for c in eligible}
            for c in candidates:
                if c.replica_id not in kept:
                    scores[c.replica_id] = self.filtered_cost
        if eligible:
            pick = self.picker.pick(req, candidates, eligible, scores)
        elif self.fallback is not None:
            pick = self.fallback.pick(req, candidates, candidates, scores)
        else:
            raise NoCandidateError("no candidate replica passed the filters")
        return make_choice(self.name, req, candidates, pick.candidate, pick.reason, scores)

    def _costs(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        if not self.scorers:
            return {c.replica_id: 0.0 for c in candidates}
        first, *rest = self.scorers
        costs = first.score(req, candidates)
        out = {c.replica_id: costs[c.replica_id] for c in candidates}
        for s in rest:
            more = s.score(req, candidates)
            for rid in out:
                out[rid] += more[rid]
        return out
