"""routing/fairness.py: weighted Virtual Token Counter order, weights, work conservation, locality."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.fairness import FairQueue


@dataclass(eq=False)
class Req:
    tenant: str
    tokens: int
    pool: str = "p"
    warm: bool = True


def drain(q: FairQueue[Req], rounds: int, place=lambda r: "warm") -> list[Req]:
    """Release up to ``rounds`` requests, charging each one's tokens, re-queueing nothing."""
    out = []
    for _ in range(rounds):
        sel = q.select(place)
        if sel is None:
            break
        q.remove(sel.tenant_id, sel.item)
        q.charge(sel.tenant_id, sel.item.tokens)
        out.append(sel.item)
    return out


def backlogged_service(weights: dict[str, float], tokens: dict[str, int], releases: int) -> dict[str, int]:
    """Every tenant keeps a request queued (re-queued at once): tokens served per tenant."""
    q: FairQueue[Req] = FairQueue()
    served = {t: 0 for t in weights}
    for t in weights:  # two each, so a tenant stays backlogged while its next request is pushed
        q.push(t, Req(t, tokens[t]), weights[t])
        q.push(t, Req(t, tokens[t]), weights[t])
    for _ in range(releases):
        sel = q.select(lambda r: "warm")
        assert sel is not None
        q.remove(sel.tenant_id, sel.item)
        q.charge(sel.tenant_id, sel.item.tokens)
        served[sel.tenant_id] += sel.item.tokens
        q.push(sel.tenant_id, Req(sel.tenant_id, tokens[sel.tenant_id]), weights[sel.tenant_id])
    return served


@settings(max_examples=60, deadline=None)
@given(wa=st.integers(1, 4), wb=st.integers(1, 4), ta=st.integers(1, 2000), tb=st.integers(1, 2000))
def test_backlogged_tenants_get_tokens_in_weight_ratio(wa: int, wb: int, ta: int, tb: int) -> None:
    """Both backlogged: weighted service differs by at most one request's weighted cost (VTC bound)."""
    served = backlogged_service({"a": wa, "b": wb}, {"a": ta, "b": tb}, 400)
    diff = abs(served["a"] / wa - served["b"] / wb)
    assert diff <= max(ta / wa, tb / wb) + 1e-6


def test_weights_two_to_one_give_two_to_one_service() -> None:
    served = backlogged_service({"gold": 2.0, "std": 1.0}, {"gold": 100, "std": 100}, 300)
    assert served["gold"] / served["std"] == pytest.approx(2.0, rel=0.02)


def test_short_requests_are_not_held_behind_a_long_backlog() -> None:
    """A heavy sender's queue does not delay a light one: B's request goes next."""
    q: FairQueue[Req] = FairQueue()
    for _ in range(16):
        q.push("a", Req("a", 4000))
    drain(q, 2)  # a served twice: its counter is ahead
    q.push("b", Req("b", 50))
    sel = q.select(lambda r: "warm")
    assert sel is not None and sel.tenant_id == "b"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from(["p", "q"])), min_size=1, max_size=30),
       st.sets(st.sampled_from(["p", "q"])))
def test_work_conserving_releases_whatever_can_be_placed(items: list[tuple[str, str]], open_pools: set[str]) -> None:
    """If any queued request (within the scan depth) can be placed, select returns one that can."""
    q: FairQueue[Req] = FairQueue(scan_depth=64)
    reqs = [Req(t, 10, pool) for t, pool in items]
    for r in reqs:
        q.push(r.tenant, r)
    place = lambda r: "warm" if r.pool in open_pools else None  # noqa: E731
    sel = q.select(place)
    if any(r.pool in open_pools for r in reqs):
        assert sel is not None and sel.item.pool in open_pools
    else:
        assert sel is None


def test_idle_system_gives_one_tenant_everything() -> None:
    q: FairQueue[Req] = FairQueue()
    for _ in range(10):
        q.push("a", Req("a", 1000))
    assert len(drain(q, 100)) == 10


def test_idle_tenant_banks_no_credit() -> None:
    """A tenant that was idle while another was served is lifted to the backlogged minimum."""
    q: FairQueue[Req] = FairQueue()
    q.push("b", Req("b", 1))
    drain(q, 1)
    for _ in range(20):
        q.push("a", Req("a", 1000))
    drain(q, 10)  # a's counter: 10,000
    q.push("b", Req("b", 1000))
    assert q.counter("b") == pytest.approx(q.counter("a"))


def test_fifo_within_a_tenant() -> None:
    q: FairQueue[Req] = FairQueue()
    reqs = [Req("a", 1) for _ in range(5)]
    for r in reqs:
        q.push("a", r)
    assert drain(q, 5) == reqs


def test_warm_request_within_slack_goes_before_a_cold_fair_one() -> None:
    q: FairQueue[Req] = FairQueue(locality_slack_tokens=500)
    cold = Req("a", 100, warm=False)
    warm = Req("b", 100, warm=True)
    q.push("a", cold)
    q.push("b", warm)
    q.charge("b", 300)  # b is behind in fairness, but within the slack
    place = lambda r: "warm" if r.warm else "cold"  # noqa: E731
    assert q.select(place).item is warm
    q.charge("b", 1000)  # now beyond the slack: fairness wins, the request goes cold
    assert q.select(place).item is cold


def test_without_slack_fairness_decides() -> None:
    q: FairQueue[Req] = FairQueue(locality_slack_tokens=0)
    cold, warm = Req("a", 1, warm=False), Req("b", 1, warm=True)
    q.push("a", cold)
    q.push("b", warm)
    q.charge("b", 1)
    assert q.select(lambda r: "warm" if r.warm else "cold").item is cold


def test_remove_takes_a_request_out_at_once() -> None:
    q: FairQueue[Req] = FairQueue()
    r1, r2 = Req("a", 1), Req("a", 1)
    q.push("a", r1)
    q.push("a", r2)
    assert q.remove("a", r1) and q.queued("a") == 1 and len(q) == 1
    assert not q.remove("a", r1)
    assert q.select(lambda r: "warm").item is r2


def test_bad_arguments() -> None:
    with pytest.raises(ValueError):
        FairQueue(locality_slack_tokens=-1)
    with pytest.raises(ValueError):
        FairQueue(scan_depth=0)
    with pytest.raises(ValueError):
        FairQueue().push("a", Req("a", 1), weight=0)
