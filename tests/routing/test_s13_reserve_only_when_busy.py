"""Session 13: opt-in ``dispatch_share_reserve_only_when_busy``: the dispatch-share guard's
session-11 reserve (a placement leaves room for its own next turn) holds only while every candidate
has a request prefilling; while one is idle a placement gets the plain cap (docs/routing.md,
"Session 13": at prefill ×2 the reserve moved placements for nothing and cost hit rate)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from routing import Candidate, ReplicaLoad, RouteRequest
from routing.filters.dispatch_share import DispatchShareFilter
from routing.policies.cache_aware import CacheAwareConfig, CacheAwarePolicy
from sim.des_grid import BUSY_RESERVE_RULES, KNOWN_RULES


def _req() -> RouteRequest:
    return RouteRequest("t0", tuple(bytes([i]) * 16 for i in range(4)), 64, 8, 16)


def _cand(rid: str, prefilling: int) -> Candidate:
    return Candidate(rid, ReplicaLoad(rid, 100 * prefilling, 0, prefilling, prefilling), 0)


def _filled(**kw: bool) -> DispatchShareFilter:
    """a: 11 of 29 recent dispatches over 3 replicas; the next makes 30, cap 12: a placement on a fills
    a to exactly its cap (test_s11_reserve_next_turn's case)."""
    f = DispatchShareFilter(1.2, 200, **kw)
    for rid in ["a"] * 11 + ["b"] * 9 + ["c"] * 9:
        f.record(rid)
    return f


def _kept(f: DispatchShareFilter, busy: tuple[int, int, int]) -> list[str]:
    return [c.replica_id for c in f.filter(_req(), [_cand(r, p) for r, p in zip("abc", busy, strict=True)])]


def test_the_reserve_holds_only_while_every_candidate_is_prefilling() -> None:
    only_busy = _filled(reserve_next_turn=True, reserve_only_when_busy=True)
    assert _kept(only_busy, (1, 2, 1)) == ["b", "c"]  # all busy: the reserve (as session 11's)
    assert _kept(only_busy, (1, 0, 1)) == ["a", "b", "c"]  # b idle: the plain cap
    assert _kept(_filled(reserve_next_turn=True), (1, 0, 1)) == ["b", "c"]  # session 11's reserve always
    assert _kept(_filled(reserve_only_when_busy=True), (1, 1, 1)) == ["a", "b", "c"]  # no reserve: no effect


@settings(max_examples=150, deadline=None)
@given(counts=st.lists(st.integers(0, 60), min_size=2, max_size=8), busy=st.lists(st.integers(0, 3), min_size=8,
                                                                                   max_size=8))
def test_between_the_plain_cap_and_the_reserve(counts: list[int], busy: list[int]) -> None:
    """With the option the kept set is the reserve's (all busy) or the plain cap's (one idle), never
    empty."""
    ids = [f"r{i}" for i in range(len(counts))]
    kept = {}
    for name, kw in (("plain", {}), ("reserve", {"reserve_next_turn": True}),
                     ("busy", {"reserve_next_turn": True, "reserve_only_when_busy": True})):
        f = DispatchShareFilter(1.2, 10_000, **kw)
        for rid, n in zip(ids, counts, strict=True):
            for _ in range(n):
                f.record(rid)
        kept[name] = {c.replica_id for c in f.filter(_req(), [_cand(r, busy[i]) for i, r in enumerate(ids)])}
    assert kept["busy"]
    all_busy = all(busy[i] >= 1 for i in range(len(ids)))
    assert kept["busy"] == (kept["reserve"] if all_busy else kept["plain"])


def test_config_plumbs_the_option_and_it_is_off_by_default() -> None:
    assert CacheAwareConfig().dispatch_share_reserve_only_when_busy is False
    assert CacheAwarePolicy().dispatch_share.reserve_only_when_busy is False  # type: ignore[union-attr]
    pol = CacheAwarePolicy(dispatch_share_reserve_next_turn=True, dispatch_share_reserve_only_when_busy=True)
    assert pol.dispatch_share.reserve_only_when_busy is True  # type: ignore[union-attr]
    assert set(BUSY_RESERVE_RULES) <= set(KNOWN_RULES)
