"""Session 12: the dispatch-share guard's opt-in floor (``cache_aware``'s ``dispatch_share_floor``,
:mod:`routing.filters.dispatch_share`): a placement goes to the replicas under ``floor`` times the
mean recent share when any is; follow-up turns (a candidate holds more of the prompt) are untouched."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from routing.filters.dispatch_share import DispatchShareFilter
from routing.policies import build_policy
from routing.policies.cache_aware import CacheAwareConfig
from routing.types import Candidate, ReplicaLoad, RouteRequest


def _req(blocks: int = 4) -> RouteRequest:
    keys = tuple(bytes([i]) * 16 for i in range(blocks))
    return RouteRequest("t0", keys, blocks * 16, 8, 16)


def _cand(rid: str, matched: int = 0) -> Candidate:
    return Candidate(rid, ReplicaLoad(rid), matched)


def _filled(floor: float | None) -> DispatchShareFilter:
    f = DispatchShareFilter(1.2, 200, floor=floor)
    for rid in ["a"] * 9 + ["b"] * 9 + ["c"] * 4:  # mean 7.33, cap ceil(1.2 * 23 / 3) = 10: all fit
        f.record(rid)
    return f


def test_a_placement_goes_to_the_replica_under_the_floor() -> None:
    cands = [_cand("a"), _cand("b"), _cand("c")]
    assert [c.replica_id for c in _filled(None).filter(_req(), cands)] == ["a", "b", "c"]  # all within the cap
    assert [c.replica_id for c in _filled(0.8).filter(_req(), cands)] == ["c"]  # 4 < 0.8 * 7.33
    assert [c.replica_id for c in _filled(0.5).filter(_req(), cands)] == ["a", "b", "c"]  # 4 is not < 0.5 * 7.33


def test_a_follow_up_turn_is_not_moved_by_the_floor() -> None:
    cands = [_cand("a", matched=3), _cand("b"), _cand("c")]
    kept = {c.replica_id for c in _filled(0.8).filter(_req(), cands)}
    assert kept == {"a", "b", "c"}  # the holder a keeps its turn; b and c within the cap


def test_same_match_everywhere_is_a_placement() -> None:
    cands = [_cand("a", matched=1), _cand("b", matched=1), _cand("c", matched=1)]  # a shared system prompt
    assert [c.replica_id for c in _filled(0.8).filter(_req(), cands)] == ["c"]


def test_range_off_by_default_and_plumbed() -> None:
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError):
            DispatchShareFilter(1.2, 200, floor=bad)
        with pytest.raises(ValidationError):
            CacheAwareConfig(dispatch_share_floor=bad)
    assert CacheAwareConfig().dispatch_share_floor is None
    pol = build_policy("cache_aware", {"dispatch_share_floor": 0.8})
    assert pol.dispatch_share is not None and pol.dispatch_share.floor == 0.8
    assert build_policy("cache_aware", {}).dispatch_share.floor is None  # type: ignore[union-attr]
