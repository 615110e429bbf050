"""The plugin interfaces of a routing policy: filter → scorer → picker.

Written the way llm-d's inference scheduler is: a policy is a chain of small,
named plugins, each in its own module under ``routing/filters``,
``routing/scorers`` and ``routing/pickers``, composed by
:class:`routing.scheduler.Scheduler`:

1. **filters** narrow the candidates (``Filter.filter``), one after the other;
2. **scorers** give every candidate a cost in seconds, weight applied
   (``Scorer.score``); the costs of all scorers are summed in order;
3. the **picker** takes one eligible candidate (``Picker.pick``) and says why;
   a **fallback** picker runs on all candidates when the filters left none.

Unlike llm-d (higher score is better), costs here are lower-is-better, in
seconds of estimated time to first token where the scorer models time.
Plugins are pure: they read the request and the candidates' local view (load,
matched prefix blocks) and never touch the index or the load tracker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from routing.hashing import prefix_tokens
from routing.types import Candidate, NoCandidateError, RouteChoice, RouteRequest

__all__ = ["Filter", "Scorer", "Picker", "Pick", "RoutingPolicy", "make_choice", "require_candidates"]


@runtime_checkable
class Filter(Protocol):
    """Keeps the candidates that may take the request."""

    name: str

    def filter(self, req: RouteRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
        """The subset of ``candidates`` (order kept) eligible for ``req``;
        may be empty."""
        ...


@runtime_checkable
class Scorer(Protocol):
    """Gives each candidate a cost (lower is better), its weight applied."""

    name: str

    def score(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
        """Cost per candidate id, for every one of ``candidates``."""
        ...


@dataclass(frozen=True)
class Pick:
    """A picker's answer: the ``candidate`` and a short machine-friendly ``reason``."""

    candidate: Candidate
    reason: str


@runtime_checkable
class Picker(Protocol):
    """Chooses one candidate among the eligible ones."""

    name: str

    def pick(
        self,
        req: RouteRequest,
        candidates: Sequence[Candidate],
        eligible: Sequence[Candidate],
        scores: Mapping[str, float],
    ) -> Pick:
        """One of ``eligible`` (non-empty); ``candidates`` are all of them
        (before filtering), ``scores`` the summed costs by id."""
        ...


@runtime_checkable
class RoutingPolicy(Protocol):
    """Interface of every routing policy (what the router calls)."""

    name: str

    def choose(self, req: RouteRequest, candidates: Sequence[Candidate]) -> RouteChoice:
        """Pick one of ``candidates`` for ``req``; raises
        :class:`NoCandidateError` when ``candidates`` is empty."""
        ...


def require_candidates(cands: Sequence[Candidate]) -> None:
    """Raise :class:`NoCandidateError` when ``cands`` is empty."""
    if not cands:
        raise NoCandidateError("no candidate replica")


def make_choice(
    policy: str,
    req: RouteRequest,
    cands: Sequence[Candidate],
    chosen: Candidate,
    reason: str,
    scores: Mapping[str, float],
) -> RouteChoice:
    """The :class:`RouteChoice` of ``chosen`` among ``cands`` (predicted and
    available prefix tokens from the matched blocks)."""
    best = max(c.matched_blocks for c in cands)
    return RouteChoice(
        replica_id=chosen.replica_id,
        policy=policy,
        predicted_prefix_tokens=prefix_tokens(req, chosen.matched_blocks),
        available_prefix_tokens=prefix_tokens(req, best),
        reason=reason,
        scores=dict(scores),
    )
