"""Session 13: test_s2's DES calibration checks judge the estimates the router read at its last
routing decision, on several trace windows (:mod:`sim.des_robustness`).

Why (docs/routing.md "Session 13"): after a window's last arrival each replica still delivers
~30-40 first bytes, about half the weight of a fit with ``forget`` 0.98, with no later arrival
sharing a chunked replica's rate; the fit's missing term (arrivals after dispatch) is then absent
and the learnt rate jumps (up to +66 % on the defaults) in an estimate no routing decision reads.
"""

from __future__ import annotations

import pytest

from routing.calibration import Calibration
from sim import des
from sim.des_robustness import ReadRecordingCalibration, WindowCheck, run_window, windows


def test_the_recording_calibration_keeps_what_it_last_returned() -> None:
    cal = ReadRecordingCalibration(prior_rate=1000.0)
    assert cal.estimate("r0") is None and cal.last_read == {"r0": None}
    for i in range(25):
        cal.observe_first_byte("r0", 100.0 + 10 * i, 0.0, 0.1 + (100.0 + 10 * i) / 1000.0)
    assert cal.last_read["r0"] is None  # observing is not reading
    est = cal.estimate("r0")
    assert est is not None and cal.last_read["r0"] is est
    assert isinstance(cal, Calibration)


def test_failed_letters() -> None:
    ok = WindowCheck("chunked", 260, 0.1, 0.0, 0.3, 1.05, True)
    assert ok.failed() == ""
    assert WindowCheck("chunked", 240, 0.25, 0.0, 0.5, 1.0, True).failed() == "S240RW"
    assert WindowCheck("fifo", 300, 0.1, 0.7, 1.0, 1.0, True).failed() == "W"
    assert WindowCheck("fifo", 300, 0.1, 0.9, 1.0, 1.0, False).failed() == "uncalibrated"
    with pytest.raises(ValueError):
        run_window({}, [], "fifo", 1.0, at="later")


def test_the_drain_moves_a_chunked_replicas_rate_and_the_decision_read_does_not_see_it() -> None:
    """Defaults, chunked x0.5, trace window 5 (rows 10000..11999): after the run a replica's learnt
    rate is > 20 % off (the drain); at the last routing decision every replica is within 20 %."""
    reqs = windows(6, 2000)[5]
    end = run_window({}, reqs, "chunked", 0.5, at="end")
    at_decision = run_window({}, reqs, "chunked", 0.5)
    assert end.rate_error > 0.20, end
    assert at_decision.calibrated and at_decision.rate_error <= 0.20, at_decision
    assert at_decision.fewest == end.fewest  # the same run: only the reading time differs


def test_windows_are_consecutive_and_start_at_zero() -> None:
    a, b = windows(2, 50)
    assert len(a) == len(b) == 50
    assert a[0].arrival == 0.0 and b[0].arrival == 0.0
    full = des.load_trace(rows=100)
    assert b[1].arrival == pytest.approx(full[51].arrival - full[50].arrival)
