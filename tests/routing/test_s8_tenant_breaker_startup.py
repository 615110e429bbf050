"""Review R7b-1's residual (session 8): at start-up, before any other tenant has used a replica, one
tenant's failures must not open the replica's shared circuit for everyone; failures of two or more
tenants (a real fault) still must (failures of no known tenant: tests/routing/test_s7_tenant_breaker_unit.py)."""

from __future__ import annotations

from gateway.replicas import CircuitState, Replica, ReplicaSet
from gateway.tenant_breaker import TenantBreaker
from tests.routing.test_s7_tenant_breaker_unit import Clock


def _set(threshold: int = 3) -> ReplicaSet:
    return ReplicaSet([Replica("r0", "http://r0"), Replica("r1", "http://r1")], failure_threshold=threshold,
                      cooldown_s=5.0, clock=Clock())


def test_one_tenant_alone_at_start_up_opens_only_its_own_pair() -> None:
    rs = _set()
    retries = []
    for _ in range(6):  # twice the threshold, nobody else has used r0 yet
        att = rs.attempt("r0", "a")
        att.failed()
        retries.append(att.retry)
    assert rs.state("r0").circuit is CircuitState.CLOSED  # before: OPEN for every tenant
    assert rs.state("r0").consecutive_failures == 0
    assert [r.id for r in rs.candidates(("default",), "b")] == ["r0", "r1"]
    assert [r.id for r in rs.candidates(("default",), "a")] == ["r1"]  # its own pair is open
    assert retries == [True] * 6  # held without evidence: a real fault's request may still go elsewhere
    rs.attempt("r0", "b").succeeded()  # the newcomer is served there


def test_failures_of_two_tenants_at_start_up_open_the_shared_circuit() -> None:
    rs = _set()
    rs.attempt("r0", "a").failed()  # held: a alone so far
    for _ in range(3):
        rs.attempt("r0", "b").failed()  # a's last verdict is a failure too: the replica's
    assert rs.state("r0").circuit is CircuitState.OPEN


def test_held_and_attributed_failures_are_told_apart() -> None:
    clock = Clock()
    tb = TenantBreaker(5, 1.0, window_s=10.0, clock=clock)
    held = tb.failed("r0", "a")
    assert held.attributed and not held.evidence and held.retry
    tb.succeeded("r0", "b")
    with_evidence = tb.failed("r0", "a")
    assert with_evidence.attributed and with_evidence.evidence and not with_evidence.retry  # streak 2
    clock.t += 10.5  # b's success is stale (window 10 s; entries live 11 s): held again
    assert tb.failed("r0", "a") == type(held)(True, 3, False, True, False)
