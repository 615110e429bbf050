"""Review R7b-1: gateway/tenant_breaker.py and its hook in gateway/replicas.py, on a fake clock."""

from __future__ import annotations

from gateway.replicas import CircuitState, Replica, ReplicaSet
from gateway.tenant_breaker import TenantBreaker


class Clock:
    """Monotonic seconds for the breakers, 100.0 at first; set ``t`` to move it."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_failures_of_one_tenant_while_others_succeed_open_only_its_pair() -> None:
    clock = Clock()
    rs = ReplicaSet([Replica("r0", "http://r0"), Replica("r1", "http://r1")], failure_threshold=3,
                    cooldown_s=5.0, clock=clock)
    opened: list[tuple[str, str]] = []
    rs.tenants.on_open = lambda r, t: opened.append((r, t))
    rs.attempt("r0", "b").succeeded()
    retries = []
    for _ in range(5):
        att = rs.attempt("r0", "a")
        att.failed()
        retries.append(att.retry)
    assert rs.state("r0").circuit is CircuitState.CLOSED and rs.state("r0").consecutive_failures == 0
    assert opened == [("r0", "a")]
    assert retries == [True, False, False, False, False]  # no second replica once the tenant has a streak
    assert [r.id for r in rs.candidates(("default",), "a")] == ["r1"]
    assert [r.id for r in rs.candidates(("default",), "b")] == ["r0", "r1"]
    clock.t += 5.0  # cool-down over: the pair is routable again
    assert [r.id for r in rs.candidates(("default",), "a")] == ["r0", "r1"]
    rs.attempt("r0", "a").failed()  # one more failure re-opens it
    assert [r.id for r in rs.candidates(("default",), "a")] == ["r1"] and len(opened) == 2


def test_failures_of_every_tenant_open_the_shared_circuit() -> None:
    clock = Clock()
    rs = ReplicaSet([Replica("r0", "http://r0")], failure_threshold=3, cooldown_s=5.0, clock=clock)
    rs.attempt("r0", "a").succeeded()
    rs.attempt("r0", "b").succeeded()
    rs.attempt("r0", "a").failed()  # b still fine: a's
    rs.attempt("r0", "b").failed()  # a failing too: the replica's
    rs.attempt("r0", "a").failed()
    rs.attempt("r0", "b").failed()
    assert rs.state("r0").circuit is CircuitState.OPEN


def test_no_tenant_counts_against_the_replica_one_tenant_alone_does_not() -> None:
    """Session 8 (R8-2): one tenant alone counts against its (replica, tenant) pair only; a verdict
    with no tenant still counts against the shared circuit."""
    rs = ReplicaSet([Replica("r0", "http://r0")], failure_threshold=2, cooldown_s=5.0, clock=Clock())
    rs.attempt("r0", "a").failed()
    rs.attempt("r0", "a").failed()
    assert rs.state("r0").circuit is CircuitState.CLOSED and rs.tenants.blocked("r0", "a")
    rs.attempt("r0").failed()
    rs.attempt("r0").failed()
    assert rs.state("r0").circuit is CircuitState.OPEN


def test_stale_success_of_another_tenant_is_no_evidence() -> None:
    """A success older than the window no longer blames the failing tenant's input: its failures
    stay its pair's (R8-2) but are retried elsewhere (no evidence that the input is the cause)."""
    clock = Clock()
    tb = TenantBreaker(2, 1.0, window_s=10.0, clock=clock)
    tb.succeeded("r0", "b")
    assert tb.failed("r0", "a").attributed and not tb.failed("r0", "a").retry  # fresh: a's input
    clock.t += 11.0
    verdicts = [tb.failed("r0", "c") for _ in range(2)]
    assert all(v.attributed and v.retry for v in verdicts)


def test_table_is_bounded_and_entries_expire() -> None:
    clock = Clock()
    tb = TenantBreaker(2, 1.0, window_s=10.0, max_tenants=8, clock=clock)
    for i in range(100):
        tb.succeeded("r0", f"t{i}")
    table = tb._table("r0")
    assert len(table) <= 8
    clock.t += 12.0
    table.expire()
    assert len(table) == 0
