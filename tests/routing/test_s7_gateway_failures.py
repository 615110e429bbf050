"""Review R7-2 (unit): only gateway failures count against a replica, and a half-open probe's
circuit verdict comes at the first byte of its answer.

Before: every 5xx was a replica failure and was retried on another replica, so a tenant whose
input makes the engine answer 500 (a "query of death") opened every replica's circuit for all
tenants; and a half-open probe's verdict waited for the end of its stream, so one long stream held
the replica out of rotation for a whole generation.
"""

from __future__ import annotations

import pytest

from gateway.proxy import UpstreamFailure
from gateway.replicas import CircuitState, Replica, ReplicaSet, counts_against_replica, retryable_status


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def replicas(clock: Clock) -> ReplicaSet:
    return ReplicaSet([Replica("a", "http://a"), Replica("b", "http://b")], failure_threshold=3, cooldown_s=5.0,
                      clock=clock)


def test_plain_500s_never_open_the_circuit() -> None:
    rs = replicas(Clock())
    for _ in range(20):
        rs.record_status("a", 500)
        rs.record_status("a", 501)
    assert rs.is_routable("a") and rs.state("a").consecutive_failures == 0


@pytest.mark.parametrize("status", [502, 503, 504])
def test_gateway_failure_statuses_still_open_it(status: int) -> None:
    rs = replicas(Clock())
    for _ in range(3):
        rs.record_status("a", status)
    assert not rs.is_routable("a") and rs.is_routable("b")


@pytest.mark.parametrize("kind", ["connect", "timeout", "protocol"])
def test_local_origin_errors_still_open_it(kind: str) -> None:
    rs = replicas(Clock())
    for _ in range(3):
        with rs.attempt("a") as att:
            fail = UpstreamFailure(kind, "x", reached=kind != "connect")
            assert fail.replica_fault
            att.failed()
    assert not rs.is_routable("a")


def test_a_500_is_a_passed_on_request_failure_not_retried() -> None:
    fail = UpstreamFailure("status", "replica answered 500", status=500, body=b'{"error": {"message": "trace"}}')
    assert not fail.retryable and not fail.replica_fault
    assert b"trace" not in fail.body  # the engine's text is not passed on
    assert not counts_against_replica(500) and not retryable_status(500)
    assert retryable_status(429) and not counts_against_replica(429)


def open_then_half_open(rs: ReplicaSet, clock: Clock) -> None:
    for _ in range(3):
        rs.record_failure("a")
    clock.t += 5.0
    assert rs.state("a").circuit is CircuitState.HALF_OPEN


def test_half_open_probe_closes_the_circuit_at_first_byte() -> None:
    clock = Clock()
    rs = replicas(clock)
    open_then_half_open(rs, clock)
    probe = rs.attempt("a")
    assert probe.probe and not rs.is_routable("a")  # the probe is in flight: nothing else goes there
    probe.first_byte()
    assert rs.state("a").circuit is CircuitState.CLOSED and rs.is_routable("a")  # before R7-2: at the end only
    assert not probe.settled  # the answer's end still gives the attempt's verdict
    probe.failed()  # the stream broke later: one failure on the closed circuit, not a re-open
    assert rs.state("a").circuit is CircuitState.CLOSED and rs.state("a").consecutive_failures == 1


def test_first_byte_of_a_non_probe_gives_no_verdict_and_a_late_release_frees_no_other_probe() -> None:
    clock = Clock()
    rs = replicas(clock)
    normal = rs.attempt("a")
    normal.first_byte()
    assert not normal.settled and rs.state("a").consecutive_failures == 0
    normal.release()
    open_then_half_open(rs, clock)
    first = rs.attempt("a")
    first.first_byte()  # closes the circuit
    open_then_half_open(rs, clock)
    second = rs.attempt("a")  # a new probe
    first.release()  # the first probe's request ends without a verdict: must not free the second probe
    assert rs.state("a").probe_in_flight and second.probe
