"""Session 11: the dispatch-share guard's opt-in ``reserve_next_turn`` (a placement leaves room for
its own next turn, which will come to the same replica exempt as its prefix holder)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from routing import Candidate, ReplicaLoad, RouteRequest
from routing.filters.dispatch_share import DispatchShareFilter, placement_cap
from routing.policies.cache_aware import CacheAwareConfig, CacheAwarePolicy
from sim.des_grid import ALL_RULES, RESERVE_RULES, RULES


def _req(blocks: int = 4) -> RouteRequest:
    return RouteRequest("t0", tuple(bytes([i]) * 16 for i in range(blocks)), blocks * 16, 8, 16)


def _cand(rid: str, matched: int = 0) -> Candidate:
    return Candidate(rid, ReplicaLoad(rid), matched)


def _filled(reserve: bool) -> DispatchShareFilter:
    """a: 11 of 29 recent dispatches over 3 replicas; the next dispatch makes 30, cap ceil(1.2·30/3) = 12:
    a placement on a would fill a to exactly its cap."""
    f = DispatchShareFilter(1.2, 200, reserve_next_turn=reserve)
    for rid in ["a"] * 11 + ["b"] * 9 + ["c"] * 9:
        f.record(rid)
    return f


def test_a_placement_that_fills_a_replica_to_its_cap_is_refused_with_the_reserve() -> None:
    cands = [_cand("a"), _cand("b"), _cand("c")]
    assert [c.replica_id for c in _filled(False).filter(_req(), cands)] == ["a", "b", "c"]
    assert [c.replica_id for c in _filled(True).filter(_req(), cands)] == ["b", "c"]


def test_prefix_holder_stays_exempt_and_the_load_guard_credit_keeps_the_full_cap() -> None:
    f = _filled(True)
    cands = [_cand("a", matched=3), _cand("b", matched=1), _cand("c", matched=1)]
    assert [c.replica_id for c in f.filter(_req(), cands)] == ["a", "b", "c"]
    assert f.within_share(cands[0])  # 11 + 1 <= 12: within_share is about the cap, not the reserve


def test_placement_cap_arithmetic() -> None:
    assert placement_cap(12, 30, 3, False) == 12
    assert placement_cap(12, 30, 3, True) == 11
    assert placement_cap(1, 1, 6, True) == 1  # never below ceil(total / n): the first dispatch fits
    assert placement_cap(100, 500, 6, True) == 99


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(0, 60), min_size=2, max_size=8), factor=st.floats(1.0, 2.0))
def test_never_empty_and_never_wider_than_without(counts: list[int], factor: float) -> None:
    """The least-used candidate always fits; the reserve only removes candidates."""
    ids = [f"r{i}" for i in range(len(counts))]
    kept = {}
    for reserve in (False, True):
        f = DispatchShareFilter(factor, 10_000, reserve_next_turn=reserve)
        for rid, n in zip(ids, counts, strict=True):
            for _ in range(n):
                f.record(rid)
        kept[reserve] = {c.replica_id for c in f.filter(_req(), [_cand(r) for r in ids])}
        least = ids[counts.index(min(counts))]
        assert least in kept[reserve]
    assert kept[True] <= kept[False]
    total = sum(counts) + 1
    assert placement_cap(math.ceil(factor * total / len(counts)), total, len(counts), True) >= math.ceil(
        total / len(counts))


def test_config_plumbs_the_option_and_it_is_off_by_default() -> None:
    assert CacheAwareConfig().dispatch_share_reserve_next_turn is False
    assert CacheAwarePolicy().dispatch_share.reserve_next_turn is False  # type: ignore[union-attr]
    pol = CacheAwarePolicy(dispatch_share_reserve_next_turn=True)
    assert pol.dispatch_share.reserve_next_turn is True  # type: ignore[union-attr]


def test_des_grid_knows_the_reserve_rules() -> None:
    assert set(RESERVE_RULES) == {"rsv_ext0", "rsv_ext0.5"}
    assert set(ALL_RULES) == set(RULES) | set(RESERVE_RULES)
    pol = ALL_RULES["rsv_ext0.5"]("fifo")
    assert pol.config.dispatch_share_reserve_next_turn and pol.config.queue_externality_weight == 0.5
