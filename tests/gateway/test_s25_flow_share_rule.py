"""gateway/flow_share.py as pure logic (S25-newcomer-1): the VTC share of a replica's prefill room
and which tenants count as active, with a fake clock (no sleeps)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.flow_share import TenantShares, share_tokens, within_share

rooms = st.integers(min_value=1, max_value=1 << 20)
weights = st.floats(min_value=0.01, max_value=100.0, allow_nan=False)
tokens = st.integers(min_value=0, max_value=1 << 20)


@given(rooms, weights, st.lists(weights, min_size=1, max_size=8))
def test_shares_of_active_tenants_add_up_to_the_room(room: int, w: float, others: list[float]) -> None:
    ws = [w, *others]
    total = sum(share_tokens(room, x, sum(ws) - x) for x in ws)
    assert total == pytest.approx(room, rel=1e-9)


@given(rooms, weights, weights, weights)
def test_a_heavier_tenant_gets_no_smaller_share(room: int, w1: float, w2: float, others: float) -> None:
    lo, hi = sorted((w1, w2))
    assert share_tokens(room, lo, others) <= share_tokens(room, hi, others) + 1e-9 * room


@given(rooms, weights, tokens, tokens)
def test_a_tenant_alone_may_use_the_whole_room(room: int, w: float, held: int, uncached: int) -> None:
    assert share_tokens(room, w, 0.0) == room
    assert within_share(held, uncached, room, w, 0.0)


@given(rooms, weights, weights, tokens)
def test_a_tenant_holding_nothing_may_always_place_one_request(room: int, w: float, others: float,
                                                               uncached: int) -> None:
    assert within_share(0, uncached, room, w, others)


@given(rooms, weights, weights, st.integers(min_value=1, max_value=1 << 20), tokens)
def test_under_contention_what_is_held_after_placing_stays_within_the_share(
        room: int, w: float, others: float, held: int, uncached: int) -> None:
    if within_share(held, uncached, room, w, others):
        assert held + uncached <= share_tokens(room, w, others)
    else:
        assert held + uncached > room * w / (w + others)


def test_bad_weight_raises() -> None:
    with pytest.raises(ValueError):
        share_tokens(100, 0.0, 1.0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class _Notify:
    def __init__(self) -> None:
        self.calls = 0

    def on_release(self) -> None:
        self.calls += 1


def make(idle_s: float = 5.0, queued: dict[str, int] | None = None) -> tuple[TenantShares, Clock]:
    q = queued if queued is not None else {}
    clock = Clock()
    return TenantShares(idle_s, lambda t: q.get(t, 0), clock), clock


def test_counts_per_tenant_and_replica_until_the_first_release() -> None:
    shares, _ = make()
    n = _Notify()
    h1 = shares.take("r0", "a", 300, n)
    shares.take("r1", "a", 200, n)
    assert shares.held == {"a": {"r0": 300, "r1": 200}}
    h1.on_release()  # first byte: prefill done
    assert shares.held == {"a": {"r1": 200}} and n.calls == 1
    h1.on_release()  # the end: nothing more to give back, the tracker still notified
    assert shares.held == {"a": {"r1": 200}} and n.calls == 2


def test_a_tenant_stays_active_for_idle_s_after_its_last_event() -> None:
    shares, clock = make(idle_s=5.0)
    shares.touch("a", 1.0)
    shares.touch("b", 3.0)
    assert shares.others_weight("a") == 3.0 and shares.others_weight("b") == 1.0
    clock.now += 5.0
    assert shares.others_weight("a") == 3.0  # exactly idle_s: still active
    clock.now += 0.001
    assert shares.others_weight("a") == 0.0 and shares.seen == {}  # both idle: a alone again


def test_a_tenant_holding_a_prefill_or_queued_stays_active_however_long() -> None:
    queued = {"c": 1}
    shares, clock = make(idle_s=1.0, queued=queued)
    shares.touch("a", 1.0)
    shares.touch("b", 2.0)
    shares.touch("c", 4.0)
    hold = shares.take("r0", "b", 100, _Notify())
    clock.now += 50.0
    assert shares.others_weight("a") == 6.0  # b holds a prefill, c waits in the queue
    hold.on_release()
    queued["c"] = 0
    clock.now += 1.5
    assert shares.others_weight("a") == 0.0


def test_a_weight_change_is_reflected_and_forget_drops_activity() -> None:
    shares, _ = make()
    shares.touch("a", 1.0)
    shares.touch("b", 1.0)
    shares.touch("b", 4.0)  # tier changed by a reload
    assert shares.others_weight("a") == 4.0
    shares.forget({"a"})
    assert shares.others_weight("a") == 0.0
