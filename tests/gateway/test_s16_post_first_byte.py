"""Session 16, A15-2: a plain answer's first byte (which comes with its end) is observed by the routing
calibration after the answer's last part, with the time the byte arrived: the calibration sees the same
first-byte timestamp as when the ticket was told at the byte's arrival; the ticket's finish then gives
its prefill part back with the rest (one release, one notify). A stream's first byte is still observed
and released at once."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.calibration import Calibration, CalibratingLoadTracker
from gateway.pipeline_answer import reads_perf_counter
from routing.calibration_tracker import LATE_FIRST_BYTE
from routing.load import InProcessLoadTracker
from tests.conftest import Stack
from tests.support.first_byte import one_watched_request


class _Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class _Notify:
    def __init__(self) -> None:
        self.calls = 0

    def on_release(self) -> None:
        self.calls += 1


class _Shared:
    """A tracker that is not in-process (a wrapping, non-fused calibrating ticket)."""

    def __init__(self) -> None:
        self.inner = InProcessLoadTracker()

    def dispatch(self, *a: Any, **kw: Any) -> Any:
        return self.inner.dispatch(*a, **kw)

    def snapshot(self, rid: str) -> Any:
        return self.inner.snapshot(rid)


def _ticket(clock: _Clock, fused: bool, notify: _Notify | None = None) -> tuple[Any, Calibration, Any]:
    cal = Calibration(prior_rate=1000.0)
    cal.defer_observations(True)
    inner: Any = InProcessLoadTracker() if fused else _Shared()
    tracker = CalibratingLoadTracker(inner, cal, clock)
    t = tracker.dispatch("r1", 100, 20, tenant="t", notify=notify) if fused else tracker.dispatch("r1", 100, 20,
                                                                                                   tenant="t")
    assert type(t) in LATE_FIRST_BYTE
    return t, cal, inner if fused else inner.inner


@settings(max_examples=200, deadline=None)
@given(t0=st.floats(0, 1e6), arrival=st.floats(0, 100), later=st.floats(0, 10), fused=st.booleans())
def test_late_observation_is_the_one_at_arrival(t0: float, arrival: float, later: float, fused: bool) -> None:
    clock_a, clock_b = _Clock(t0), _Clock(t0)
    now_ticket, now_cal, _ = _ticket(clock_a, fused)
    late_ticket, late_cal, _ = _ticket(clock_b, fused)
    clock_a.now = clock_b.now = t0 + arrival  # the byte arrives
    now_ticket.first_byte()
    clock_b.now = t0 + arrival + later  # the answer went out
    late_ticket.observe_first_byte_at(t0 + arrival)
    assert late_cal._pending == now_cal._pending and len(late_cal._pending) == 1
    late_ticket.observe_first_byte_at(t0 + arrival + later)  # once only
    late_ticket.first_byte()
    assert late_cal._pending == now_cal._pending


def test_late_observation_holds_the_prefill_until_finish_one_release() -> None:
    notify = _Notify()
    ticket, cal, inner = _ticket(_Clock(5.0), fused=True, notify=notify)
    ticket.observe_first_byte_at(5.5)
    assert cal.pending == 1
    assert inner.snapshot("r1").queued_prefill_tokens == 100 and notify.calls == 0  # nothing released yet
    ticket.finish()
    snap = inner.snapshot("r1")
    assert (snap.queued_prefill_tokens, snap.running_requests) == (0, 0) and notify.calls == 1
    ticket.observe_first_byte_at(6.0)  # finished: no observation
    assert cal.pending == 1


def test_no_late_observation_after_a_first_byte_or_finish() -> None:
    for fused in (True, False):
        ticket, cal, _ = _ticket(_Clock(1.0), fused)
        ticket.first_byte()
        ticket.observe_first_byte_at(2.0)
        assert cal.pending == 1
        ticket, cal, _ = _ticket(_Clock(1.0), fused)
        ticket.finish()
        ticket.observe_first_byte_at(2.0)
        assert cal.pending == 0


def test_clock_check() -> None:
    import time

    assert reads_perf_counter(time.perf_counter)
    assert not reads_perf_counter(_Clock(0.0))
    assert reads_perf_counter(time.monotonic) == (
        time.get_clock_info("monotonic").implementation == time.get_clock_info("perf_counter").implementation)


BODY = json.dumps({"model": "sim-model", "prompt": "one two three", "max_tokens": 2}).encode()


@pytest.mark.parametrize("stream", [False, True])
async def test_gateway_observes_the_arrival_time(stack: Stack, monkeypatch: pytest.MonkeyPatch, stream: bool) -> None:
    """In the gateway: the plain answer's observation is fed after its last part and its first-byte
    time is the record's ``t_first_byte`` minus the dispatch time; a stream's is fed at its first byte."""
    cal = stack.components.calibration
    assert cal is not None and reads_perf_counter(cal.clock)
    body = BODY if not stream else json.dumps({**json.loads(BODY), "stream": True}).encode()
    rec, observed, dispatched = await one_watched_request(stack, monkeypatch, body)
    assert rec.status == 200
    assert len(observed) == 1
    ttft, when = observed[0]
    if stream:
        assert when == "before any part"
        assert ttft == pytest.approx(rec.t_first_byte - dispatched[0], abs=0.05)  # type: ignore[operator]
    else:
        assert when == "last part"  # after the answer's last part was handed to the server
        assert ttft == rec.t_first_byte - dispatched[0]  # type: ignore[operator]  # the byte's arrival, exactly
