"""Session 9 review, R9-2: the per-(replica, tenant) breaker was bypassed by interleaving successes.

``TenantBreaker`` counted *consecutive* gateway failures and any 2xx of the tenant ended its streak,
so one cheap valid request after each poison request kept the pair closed forever: live, 20 POISON
requests interleaved with 20 valid ones reached the replicas 20 times (alone: 6). Now a pair also
opens at ``breaker_failures`` gateway failures within ``health.breaker_tenant_window_s``, whatever
2xx come between. Unit cases on a fake clock, and end to end against session 7's fake replicas.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.replicas import CircuitState, Replica, ReplicaSet
from gateway.tenant_breaker import TenantBreaker
from tests.gateway.test_s7_tenant_breaker import Fake, _served_on_both, completion
from tests.gateway.test_s7_tenant_breaker import fakes  # noqa: F401 - fixture (two fake replicas)
from tests.routing.test_s7_tenant_breaker_unit import Clock
from tests.support.fake_replicas import n_replicas  # noqa: F401 - fixture
from tests.support.waiting import wait_for


def test_successes_between_failures_do_not_keep_the_pair_closed() -> None:
    clock = Clock()
    tb = TenantBreaker(3, 5.0, window_s=60.0, clock=clock)
    tb.succeeded("r0", "b")
    opened = []
    for _ in range(3):
        tb.succeeded("r0", "a")  # a cheap valid request after each poison one
        clock.t += 1.0
        opened.append(tb.failed("r0", "a").opened)
        clock.t += 1.0
    assert opened == [False, False, True]  # before: never opened
    assert tb.blocked("r0", "a") and not tb.blocked("r0", "b")
    assert tb.streak("r0", "a") == 1  # the consecutive streak itself is still ended by a 2xx


def test_failures_further_apart_than_the_window_do_not_add_up() -> None:
    clock = Clock()
    tb = TenantBreaker(3, 5.0, window_s=10.0, clock=clock)
    for _ in range(6):
        tb.succeeded("r0", "a")
        assert not tb.failed("r0", "a").opened
        clock.t += 5.1  # two failures within any 10 s, never three
    assert not tb.blocked("r0", "a")


def test_after_the_cool_down_one_more_failure_in_the_window_reopens_the_pair() -> None:
    clock = Clock()
    tb = TenantBreaker(3, 5.0, window_s=60.0, clock=clock)
    for _ in range(3):
        tb.succeeded("r0", "a")
        tb.failed("r0", "a")
    assert tb.blocked("r0", "a")
    clock.t += 5.0
    assert not tb.blocked("r0", "a")
    tb.succeeded("r0", "a")
    assert tb.failed("r0", "a").opened  # 3 of its last failures are within the window


def test_interleaving_through_the_replica_set_reaches_the_replica_a_bounded_number_of_times() -> None:
    clock = Clock()
    rs = ReplicaSet([Replica("r0", "http://r0")], failure_threshold=3, cooldown_s=30.0, clock=clock)
    rs.attempt("r0", "b").succeeded()
    reached = 0
    for _ in range(20):
        if rs.tenants.blocked("r0", "a"):
            continue  # routing skips the pair: the request never reaches the replica
        reached += 1
        rs.attempt("r0", "a").failed()  # POISON
        rs.attempt("r0", "a").succeeded()  # a valid request
        clock.t += 0.5
    assert reached == 3  # before: 20
    assert rs.state("r0").circuit is CircuitState.CLOSED  # one tenant alone never opens the shared one (R8-2)


@pytest.fixture
def config_overrides(fakes: list[Fake]) -> dict[str, Any]:  # noqa: F811
    """Session 7's two fakes, breaker 3 failures, a cool-down longer than the test."""
    return {
        "replicas": [{"id": "f0", "url": fakes[0].url, "pool": "default"},
                     {"id": "f1", "url": fakes[1].url, "pool": "default"}],
        "health": {"interval_s": 0.1, "timeout_s": 2.0, "unhealthy_after": 1, "healthy_after": 1,
                   "breaker_failures": 3, "breaker_cooldown_s": 120.0},
    }


async def test_poison_interleaved_with_valid_requests_opens_the_pairs(stack: Any, fakes: list[Fake]) -> None:  # noqa: F811
    rs = stack.components.replica_set
    await wait_for(lambda: rs.routable_ids() == ["f0", "f1"], what="fake replicas healthy")
    await _served_on_both(stack, fakes, "tenant-b/app")
    statuses = []
    for i in range(20):
        for prompt in (f"POISON {i}", f"hello {i}"):
            r = await stack.client.post("/v1/completions", json=completion(prompt), headers=stack.auth("tenant-a/app"))
            statuses.append(r.status_code)
    # per replica the pair threshold, plus a first failure retried once elsewhere (as test_s8_breaker_e2e)
    assert fakes[0].poison_hits + fakes[1].poison_hits <= 2 * 3 + 2, (fakes[0].poison_hits, fakes[1].poison_hits)
    assert rs.tenants.blocked("f0", "tenant-a") and rs.tenants.blocked("f1", "tenant-a")
    assert rs.state("f0").circuit is CircuitState.CLOSED and rs.state("f1").circuit is CircuitState.CLOSED
    r = await stack.client.post("/v1/completions", json=completion("hello"), headers=stack.auth("tenant-b/app"))
    assert r.status_code == 200, r.text  # the other tenant is served (R8-2 holds)
