"""Session 13 (meter, issue 14): the last step closes the span inline (no ``_close`` call) and
``settle`` reads the measured CPU directly. Still one thread-CPU read for a short request, two for a
long one, and the charge still bounds what a costly request cost (real clocks)."""

from __future__ import annotations

import time

import pytest

from gateway.config_http import LimitsConfig
from gateway.cpu_budget import CpuBudget, CpuMeter
from tenancy.registry import Tenant


class _Clocks:
    def __init__(self) -> None:
        self.cpu, self.wall, self.cpu_reads = 0.0, 0.0, 0

    def read_cpu(self) -> float:
        self.cpu_reads += 1
        return self.cpu

    def work(self, s: float, off: float = 0.0) -> None:
        self.cpu += s
        self.wall += s + off

    def fail(self, s: float) -> None:
        self.work(s)
        raise ValueError("bad body")


def _budget(c: _Clocks) -> CpuBudget:
    return CpuBudget(LimitsConfig(refused_cpu_ms_per_s=100, refused_cpu_burst_ms=1000, prep_cpu_free_ms=1.0,
                                  prep_cpu_free_us_per_token=0.0),
                     clock=lambda: 100.0, cpu_clock=c.read_cpu, wall_clock=lambda: c.wall, wall_bounds_cpu=True)


def test_a_long_request_is_charged_its_cpu_beyond_the_allowance_with_two_reads() -> None:
    c = _Clocks()
    b = _budget(c)
    m = b.meter(Tenant(id="t"))
    m.run(c.work, 0.004, 0.003)  # preempted 3 ms: not charged
    c.work(0.000003)
    m.run(c.work, 0.002)
    assert c.cpu_reads == 2
    m.settle(True, 0)
    assert c.cpu_reads == 2
    assert b.buckets["t"].level == pytest.approx(1.0 - (0.006003 - 0.001))


def test_a_short_request_reads_once_and_a_raising_last_step_is_charged() -> None:
    c = _Clocks()
    b = _budget(c)
    m = b.meter(Tenant(id="t"))
    m.run(c.work, 0.00005)
    with pytest.raises(ValueError):
        m.run(c.fail, 0.00003)
    assert c.cpu_reads == 1
    m.settle(False, 0)  # never dispatched: all of it
    assert b.buckets["t"].level == pytest.approx(1.0 - 0.00008)


def test_the_charge_bounds_a_costly_request_on_the_real_clocks() -> None:
    b = CpuBudget(LimitsConfig(refused_cpu_ms_per_s=100, refused_cpu_burst_ms=100000))
    m = b.meter(Tenant(id="t"))
    c0 = time.thread_time()
    m.run(sum, range(300_000))  # a few ms: a long span, charged its thread CPU exactly
    m.run(sum, range(300_000))
    c1 = time.thread_time()
    m.refused()
    charged = 100.0 - b.buckets["t"].level
    assert (c1 - c0) - 1e-3 <= charged <= (c1 - c0) + 1e-6  # its steps' CPU, within the meter's own work
    assert charged > 2 * CpuMeter.WALL_EXACT_S
