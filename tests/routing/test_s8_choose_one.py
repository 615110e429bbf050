"""Issue 14 (session 8): ``cache_aware``'s one-candidate path (:meth:`CacheAwarePolicy._choose_one`)
makes the same decision as the generic chain (:meth:`Scheduler.choose`): the same replica, reason,
predicted and available prefix tokens and scores, bit for bit, and leaves the dispatch-share
filter in the same state (its cap and window)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.policies.cache_aware import CacheAwarePolicy
from routing.scheduler import Scheduler
from routing.types import Candidate, RouteChoice, RouteRequest
from tests.routing.test_s6_route_cost import _case


def _same(a: RouteChoice, b: RouteChoice) -> None:
    assert (a.replica_id, a.policy, a.predicted_prefix_tokens, a.available_prefix_tokens, a.reason) == \
        (b.replica_id, b.policy, b.predicted_prefix_tokens, b.available_prefix_tokens, b.reason)
    assert list(a.scores) == list(b.scores)
    for rid, s in b.scores.items():
        assert a.scores[rid] == s or (math.isnan(a.scores[rid]) and math.isnan(s))


def _policies(**kw: object) -> tuple[CacheAwarePolicy, CacheAwarePolicy]:
    return CacheAwarePolicy(**kw), CacheAwarePolicy(**kw)  # type: ignore[arg-type]


@settings(max_examples=500, deadline=None)
@given(_case(max_n=1), st.booleans(), st.floats(1.0, 3.0), st.one_of(st.none(), st.floats(1.0, 3.0)),
       st.floats(0.0, 8.0), st.one_of(st.none(), st.floats(1.0, 2.0)), st.booleans(),
       st.lists(st.sampled_from(["r0", "x", "y"]), max_size=12))
def test_one_candidate_path_decides_as_the_generic_chain(case: tuple[RouteRequest, list[Candidate]], calibrate: bool,
                                                         load_f: float, req_f: float | None, slack: float,
                                                         share: float | None, guard_tokens: bool,
                                                         history: list[str]) -> None:
    req, cands = case
    fast, generic = _policies(calibrate=calibrate, max_load_factor=load_f, max_request_factor=req_f,
                              slack_requests=slack, dispatch_share_factor=share, guard_tokens=guard_tokens,
                              dispatch_window_requests_per_replica=4)
    for rid in history:  # the same dispatch history in both
        for p in (fast, generic):
            if p.dispatch_share is not None:
                p.dispatch_share.record(rid)
    got = fast.choose(req, cands)
    want = Scheduler.choose(generic, req, cands)
    if generic.dispatch_share is not None:
        generic.dispatch_share.record(want.replica_id)
    _same(got, want)
    if fast.dispatch_share is not None:
        assert generic.dispatch_share is not None
        assert fast.dispatch_share.counts() == generic.dispatch_share.counts()
        assert fast.dispatch_share.within_share(cands[0]) == generic.dispatch_share.within_share(cands[0])


def test_a_replaced_plugin_takes_the_generic_chain() -> None:
    pol = CacheAwarePolicy()
    req = RouteRequest("t", (), 32, 8, 16)

    class Never:
        name = "never"

        def filter(self, req: RouteRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
            return []

    pol.filters = (Never(),)
    from routing.types import ReplicaLoad

    got = pol.choose(req, [Candidate("r0", ReplicaLoad("r0"), 0)])
    assert got.reason == "guard_fallback_least_load"  # the replaced filter ran
