"""Issue 12, finding 7 (unit): every way an upstream attempt ends settles the breaker.

``ReplicaSet.attempt`` returns an :class:`Attempt` whose first verdict wins
(``succeeded`` / ``failed`` / ``release``); leaving it as a context manager
releases it, so an exception, a cancellation or a forgotten branch can never
leave a half-open probe in flight for good.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.proxy import UpstreamFailure
from gateway.replicas import CircuitState, Replica, ReplicaSet


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def half_open() -> tuple[ReplicaSet, Clock]:
    """Replica ``a`` with its circuit opened by 3 failures and the cool-down over."""
    clock = Clock()
    rs = ReplicaSet([Replica("a", "http://a")], failure_threshold=3, cooldown_s=5.0, clock=clock)
    for _ in range(3):
        rs.record_failure("a")
    assert not rs.is_routable("a")
    clock.t = 5.0
    assert rs.is_routable("a") and rs.state("a").circuit is CircuitState.HALF_OPEN
    return rs, clock


@pytest.mark.parametrize(
    ("verdict", "circuit"),
    [
        ("succeeded", CircuitState.CLOSED),
        ("failed", CircuitState.OPEN),
        ("release", CircuitState.HALF_OPEN),
    ],
)
def test_each_verdict_settles_the_probe(verdict: str, circuit: CircuitState) -> None:
    rs, _ = half_open()
    att = rs.attempt("a")
    assert att.probe and not rs.is_routable("a")  # the single probe is in flight
    getattr(att, verdict)()
    st = rs.state("a")
    assert att.settled and not st.probe_in_flight and st.circuit is circuit
    assert rs.is_routable("a") is (circuit is not CircuitState.OPEN)


def test_first_verdict_wins() -> None:
    rs, _ = half_open()
    att = rs.attempt("a")
    att.succeeded()
    att.failed()  # e.g. a late error after the answer was complete: ignored
    att.release()
    assert rs.state("a").circuit is CircuitState.CLOSED and rs.state("a").consecutive_failures == 0


@pytest.mark.parametrize("exc", [RuntimeError("gateway bug"), asyncio.CancelledError(), KeyboardInterrupt()])
def test_leaving_the_block_without_a_verdict_releases_the_probe(exc: BaseException) -> None:
    rs, _ = half_open()
    with pytest.raises(type(exc)):
        with rs.attempt("a"):
            raise exc
    assert rs.is_routable("a") and not rs.state("a").probe_in_flight


def test_a_non_probe_release_does_not_free_another_requests_probe() -> None:
    clock = Clock()
    rs = ReplicaSet([Replica("a", "http://a")], failure_threshold=3, cooldown_s=5.0, clock=clock)
    early = rs.attempt("a")  # dispatched while closed: not a probe
    assert not early.probe
    for _ in range(3):
        rs.record_failure("a")
    clock.t = 5.0
    probe = rs.attempt("a")
    assert probe.probe
    early.release()  # its client went away
    assert rs.state("a").probe_in_flight and not rs.is_routable("a")  # still one probe at a time
    probe.release()
    assert rs.is_routable("a")


def test_verdict_on_a_removed_replica_is_dropped() -> None:
    rs, _ = half_open()
    att = rs.attempt("a")
    rs.remove("a")
    att.failed()  # never raises out of a request's ending
    assert att.settled


@pytest.mark.parametrize(
    ("status", "fault"),
    [(400, False), (404, False), (413, False), (429, False), (499, False),
     (500, False), (501, False), (502, True), (503, True), (504, True)],  # R7-2: 500 is the request's failure
)
def test_only_gateway_failure_statuses_are_replica_faults(status: int, fault: bool) -> None:
    """As Envoy's outlier detection (consecutive_gateway_failure): 502/503/504 and locally originated
    errors count; a 500 does not, and is not retried (review R7-2)."""
    fail = UpstreamFailure("status", f"replica answered {status}", status=status)
    assert fail.replica_fault is fault
    assert fail.retryable is (status in (502, 503, 504) or status == 429)


@pytest.mark.parametrize("kind", ["connect", "timeout", "protocol"])
def test_locally_originated_errors_are_replica_faults(kind: str) -> None:
    fail = UpstreamFailure(kind, "x")
    assert fail.replica_fault and fail.retryable
