from __future__ import annotations

import pytest

from gateway.replicas import CircuitState, Replica, ReplicaSet, UnknownReplicaError


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make(clock: Clock) -> ReplicaSet:
    return ReplicaSet(
        [Replica("a", "http://a", "p1"), Replica("b", "http://b", "p2", {"gpu": "h100"}, cache_salt=False)],
        failure_threshold=3,
        cooldown_s=10.0,
        clock=clock,
    )


def test_circuit_opens_half_opens_and_closes() -> None:
    clock = Clock()
    rs = make(clock)
    for _ in range(2):
        rs.record_failure("a")
    assert rs.is_routable("a")
    rs.record_failure("a")
    assert rs.state("a").circuit is CircuitState.OPEN
    assert rs.routable_ids() == ["b"]
    clock.t = 10.0
    assert rs.is_routable("a") and rs.state("a").circuit is CircuitState.HALF_OPEN
    rs.on_dispatch("a")  # the single probe
    assert not rs.is_routable("a")
    rs.record_failure("a")  # failed probe re-opens
    assert rs.state("a").circuit is CircuitState.OPEN
    clock.t = 20.0
    rs.on_dispatch("a")
    rs.record_success("a")
    assert rs.state("a").circuit is CircuitState.CLOSED and rs.is_routable("a")


def test_client_errors_do_not_count() -> None:
    rs = make(Clock())
    for _ in range(10):
        rs.record_status("a", 400)
        rs.record_status("a", 404)
    assert rs.state("a").consecutive_failures == 0 and rs.is_routable("a")
    for _ in range(3):
        rs.record_status("a", 503)
    assert not rs.is_routable("a")


def test_pools_health_instances() -> None:
    rs = make(Clock())
    assert rs.routable_ids(["p2"]) == ["b"]
    rs.mark_health("b", False)
    assert rs.routable_ids(["p2"]) == []
    assert rs.observe_instance("a", "i1") is False
    assert rs.observe_instance("a", "i1") is False
    assert rs.observe_instance("a", "i2") is True
    assert rs.get("b").labels == {"gpu": "h100"} and rs.get("b").cache_salt is False
    with pytest.raises(UnknownReplicaError):
        rs.get("zzz")
    with pytest.raises(ValueError):
        rs.add(Replica("a", "http://x"))


def test_probe_without_verdict_is_released() -> None:
    """A half-open probe whose client vanished must not keep the replica out forever."""
    t = [0.0]
    rs = ReplicaSet([Replica("a", "http://a")], failure_threshold=1, cooldown_s=5.0, clock=lambda: t[0])
    rs.record_failure("a")
    assert not rs.is_routable("a")
    t[0] = 6.0
    assert rs.is_routable("a")  # half-open: one probe allowed
    rs.on_dispatch("a")
    assert not rs.is_routable("a")  # probe in flight
    rs.release_probe("a")
    assert rs.is_routable("a")
