"""Review R8-2 / R8-4: gateway/tenant_breaker.py's rule on a fake clock (no waiting).

The rule (docs/routing.md, "Per-(replica, tenant) attribution"): a gateway failure counts against a
replica's shared circuit only when it is *corroborated*: another tenant's last verdict on that
replica is a gateway failure no older than the window and later than the replica's last 2xx
answer. Otherwise it counts against the (replica, tenant) pair only. Only a 2xx answer is evidence
that the replica serves (a 4xx/429/plain 500 is neither evidence nor a reset of a pair's streak).
"""

from __future__ import annotations

from gateway.replicas import CircuitState, Replica, ReplicaSet
from gateway.tenant_breaker import TenantBreaker


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _set(clock: Clock, **kw: float) -> ReplicaSet:
    return ReplicaSet([Replica("r0", "http://r0"), Replica("r1", "http://r1")], failure_threshold=3,
                      cooldown_s=5.0, clock=clock, **kw)  # type: ignore[arg-type]


def test_after_a_quiet_minute_one_tenant_opens_only_its_own_pair() -> None:
    """R8-2 exactly: b was served on r0, then 61 s of quiet, then a's poison (default window)."""
    clock = Clock()
    rs = _set(clock)
    rs.attempt("r0", "b").succeeded()
    clock.t += 61.0
    for _ in range(8):
        rs.attempt("r0", "a").failed()
    assert rs.state("r0").circuit is CircuitState.CLOSED and rs.state("r0").consecutive_failures == 0
    assert [r.id for r in rs.candidates(("default",), "a")] == ["r1"]
    assert [r.id for r in rs.candidates(("default",), "b")] == ["r0", "r1"]


def test_at_start_up_one_tenant_opens_only_its_own_pair_and_is_retried() -> None:
    """No other tenant ever seen (the R7b-1 start-up residual): pair only. With no evidence against
    the input either way, the failure may be retried elsewhere (a real fault seen by one tenant)."""
    clock = Clock()
    rs = _set(clock)
    retries = []
    for _ in range(4):
        att = rs.attempt("r0", "a")
        att.failed()
        retries.append(att.retry)
    assert rs.state("r0").circuit is CircuitState.CLOSED
    assert rs.tenants.blocked("r0", "a")
    assert retries == [True] * 4


def test_while_another_tenant_is_served_the_failing_tenant_is_not_retried() -> None:
    """Session 7's rule stands where there is evidence: b got a 2xx within the window, so a's
    failures are its input's and from its second one not retried on another replica."""
    clock = Clock()
    rs = _set(clock)
    rs.attempt("r0", "b").succeeded()
    retries = []
    for _ in range(4):
        att = rs.attempt("r0", "a")
        att.failed()
        retries.append(att.retry)
    assert retries == [True, False, False, False]
    assert rs.state("r0").circuit is CircuitState.CLOSED


def test_failures_of_two_tenants_are_corroborated_and_open_the_shared_circuit() -> None:
    clock = Clock()
    rs = _set(clock)
    rs.attempt("r0", "a").failed()  # a alone: its pair's
    assert rs.state("r0").consecutive_failures == 0
    for tenant in ("b", "a", "b"):  # each corroborated by the other's failure
        rs.attempt("r0", tenant).failed()
    assert rs.state("r0").circuit is CircuitState.OPEN


def test_a_2xx_after_the_other_tenants_failure_voids_its_corroboration() -> None:
    clock = Clock()
    rs = _set(clock)
    rs.attempt("r0", "b").failed()
    rs.attempt("r0", "c").succeeded()  # the replica served c after b's failure
    for _ in range(5):
        rs.attempt("r0", "a").failed()
    assert rs.state("r0").circuit is CircuitState.CLOSED


def test_an_old_failure_of_another_tenant_corroborates_nothing() -> None:
    clock = Clock()
    rs = _set(clock, tenant_window_s=10.0)
    rs.attempt("r0", "b").failed()
    clock.t += 10.5
    for _ in range(5):
        rs.attempt("r0", "a").failed()
    assert rs.state("r0").circuit is CircuitState.CLOSED


def test_no_tenant_counts_against_the_shared_circuit() -> None:
    rs = _set(Clock())
    for _ in range(3):
        rs.attempt("r0").failed()
    assert rs.state("r0").circuit is CircuitState.OPEN


def test_a_4xx_is_no_evidence_that_the_replica_serves_others() -> None:
    """R8-4: a's 4xx on r0 does not make b's failures b's own (b stays retried)."""
    clock = Clock()
    rs = _set(clock)
    retries = []
    for _ in range(4):
        rs.attempt("r0", "a").succeeded(served=False)  # a 400 from the API server
        att = rs.attempt("r0", "b")
        att.failed()
        retries.append(att.retry)
    assert retries == [True] * 4


def test_a_4xx_does_not_reset_the_tenants_own_streak() -> None:
    """Interleaving cheap 400s must not keep a tenant's pair closed to its poison."""
    clock = Clock()
    tb = TenantBreaker(3, 5.0, clock=clock)
    for _ in range(3):
        tb.succeeded("r0", "a", served=False)
        verdict = tb.failed("r0", "a")
    assert verdict.streak == 3 and verdict.opened and tb.blocked("r0", "a")


def test_a_4xx_still_resets_the_shared_count_and_closes_a_probe() -> None:
    """Decision (Envoy's consecutive_gateway_failure resets on any other answer): the shared circuit
    keeps treating a 4xx as a live replica; a half-open probe answered 400 closes it (12.7)."""
    clock = Clock()
    rs = _set(clock)
    for _ in range(3):
        rs.attempt("r0").failed()
    clock.t += 5.0
    probe = rs.attempt("r0", "a")
    assert probe.probe
    probe.succeeded(served=False)
    assert rs.state("r0").circuit is CircuitState.CLOSED


def test_window_is_validated() -> None:
    import pytest
    with pytest.raises(ValueError):
        TenantBreaker(3, 5.0, window_s=-1.0)


def test_a_request_never_sent_counts_against_the_replica_whoever_sent_it() -> None:
    """No connection could be made (``reached`` False): the tenant's input cannot be the cause, so the
    failure is the replica's at once (as Envoy counts locally originated connect failures per host)."""
    rs = _set(Clock())
    for _ in range(3):
        att = rs.attempt("r0", "a")
        att.failed(reached=False)
        assert att.retry
    assert rs.state("r0").circuit is CircuitState.OPEN
    assert rs.tenants.streak("r0", "a") == 0
