"""Issue 14 (session 23, helper "cuts"): ``cache_aware`` with one candidate computes the choice's
``reason`` and ``scores`` when they are first read (:meth:`RouteChoice.explained_later`), not at the
decision. Neutral: the same choice, reason and scores, bit for bit, as the generic chain computed at the
decision (:meth:`Scheduler.choose`), however many other decisions the policy made before the read; the
dispatch-share state after the decision is the generic chain's; reading the explanation changes no
state of the policy; a choice equals (``==``, ``repr``) the eager one."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.policies.cache_aware import CacheAwarePolicy
from routing.scheduler import Scheduler
from routing.types import Candidate, ReplicaLoad, RouteChoice, RouteRequest
from tests.routing.test_s6_route_cost import _case
from tests.routing.test_s8_choose_one import _same


def _share_state(p: CacheAwarePolicy) -> tuple[object, ...] | None:
    ds = p.dispatch_share
    if ds is None:
        return None
    return (ds.counts(), list(ds._recent), ds._cap, ds._window)  # the filter's whole state


@settings(max_examples=400, deadline=None)
@given(_case(max_n=1), st.booleans(), st.floats(1.0, 3.0), st.one_of(st.none(), st.floats(1.0, 3.0)),
       st.floats(0.0, 8.0), st.one_of(st.none(), st.floats(1.0, 2.0)), st.booleans(),
       st.lists(st.sampled_from(["r0", "x", "y"]), max_size=12), st.lists(_case(max_n=3), max_size=4))
def test_read_later_equals_the_generic_chain_at_the_decision(
        case: tuple[RouteRequest, list[Candidate]], calibrate: bool, load_f: float, req_f: float | None,
        slack: float, share: float | None, guard_tokens: bool, history: list[str],
        later: list[tuple[RouteRequest, list[Candidate]]]) -> None:
    req, cands = case
    kw = dict(calibrate=calibrate, max_load_factor=load_f, max_request_factor=req_f, slack_requests=slack,
              dispatch_share_factor=share, guard_tokens=guard_tokens, dispatch_window_requests_per_replica=4)
    lazy, generic = CacheAwarePolicy(**kw), CacheAwarePolicy(**kw)  # type: ignore[arg-type]
    for rid in history:
        for p in (lazy, generic):
            if p.dispatch_share is not None:
                p.dispatch_share.record(rid)
    got = lazy.choose(req, cands)
    want = Scheduler.choose(generic, req, cands)  # eager: reason and scores now
    if generic.dispatch_share is not None:
        generic.dispatch_share.record(want.replica_id)
    assert "reason" not in got.__dict__ and "scores" not in got.__dict__  # not computed at the decision
    assert _share_state(lazy) == _share_state(generic)  # the bookkeeping after the decision
    for r2, c2 in later:  # more decisions (more candidates too) before the read: the same answer
        lazy.choose(r2, c2)
        generic.choose(r2, c2)
    before = _share_state(lazy)
    _same(got, want)
    assert _share_state(lazy) == before  # the read changes no state
    assert got == want and repr(got) == repr(want)
    assert got.__dict__ == want.__dict__ and list(got.__dict__) == list(want.__dict__)


def test_one_candidate_choice_is_explained_later_and_many_are_not() -> None:
    pol = CacheAwarePolicy()
    req = RouteRequest("t", (b"a" * 16,), 32, 8, 16)
    one = pol.choose(req, [Candidate("r0", ReplicaLoad("r0", 5), 1)])
    assert "_explain" in one.__dict__
    assert one.reason == "best_prefix" and "_explain" not in one.__dict__
    assert list(one.__dict__) == ["replica_id", "policy", "predicted_prefix_tokens", "available_prefix_tokens",
                                  "reason", "scores"]
    two = pol.choose(req, [Candidate("r0", ReplicaLoad("r0")), Candidate("r1", ReplicaLoad("r1"))])
    assert "_explain" not in two.__dict__ and two.reason in ("best_prefix", "no_prefix", "lowest_cost")


def test_replace_and_unknown_attributes() -> None:
    pol = CacheAwarePolicy()
    req = RouteRequest("t", (), 32, 8, 16)
    got = pol.choose(req, [Candidate("r0", ReplicaLoad("r0"))])
    assert dataclasses.replace(got, replica_id="r9").reason == "no_prefix"
    with pytest.raises(AttributeError):
        got.nope  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.reason = "x"  # type: ignore[misc]


def test_a_failing_explanation_stays_pending() -> None:
    calls = []

    def explain(req: RouteRequest, c: Candidate) -> tuple[str, dict[str, float]]:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return "ok", {c.replica_id: 1.0}

    c = Candidate("r0", ReplicaLoad("r0"))
    got = RouteChoice.explained_later("r0", "p", 0, 0, explain, RouteRequest("t", (), 1, 1, 1), c)
    with pytest.raises(RuntimeError):
        got.reason  # noqa: B018
    assert got.scores == {"r0": 1.0} and got.reason == "ok" and len(calls) == 2
