"""Session 11: the preparation CPU meter reads the thread-CPU clock (a system call) once for a
short request: a span of at most ``CpuMeter.WALL_EXACT_S`` wall seconds is charged its wall time,
an upper bound of its CPU; a longer one is read twice and charged its CPU exactly."""

from __future__ import annotations

import time

import pytest

from gateway.config_http import LimitsConfig
from gateway.cpu_budget import CpuBudget, CpuMeter
from tenancy.registry import Tenant


class _Clocks:
    """A thread's CPU and the wall clock; ``off`` seconds of wall pass with no CPU (preempted)."""

    def __init__(self) -> None:
        self.cpu, self.wall, self.cpu_reads = 0.0, 0.0, 0

    def read_cpu(self) -> float:
        self.cpu_reads += 1
        return self.cpu

    def work(self, s: float, off: float = 0.0) -> None:
        self.cpu += s
        self.wall += s + off


def _budget(c: _Clocks, **limits: float) -> CpuBudget:
    return CpuBudget(LimitsConfig(refused_cpu_ms_per_s=100, refused_cpu_burst_ms=1000, **limits),
                     clock=lambda: 100.0, cpu_clock=c.read_cpu, wall_clock=lambda: c.wall, wall_bounds_cpu=True)


def test_a_short_request_reads_the_cpu_clock_once_and_is_charged_at_most_its_wall_time() -> None:
    c = _Clocks()
    b = _budget(c)
    m = b.meter(Tenant(id="t"))
    m.run(c.work, 0.00004)
    c.work(0.000002)
    m.run(c.work, 0.00003, 0.00001)  # 10 us of wall without CPU: charged (an upper bound)
    assert c.cpu_reads == 1
    assert m.cpu_s == pytest.approx(0.000082)
    m.refused()
    assert b.buckets["t"].level == pytest.approx(1.0 - 0.000082)
    assert c.cpu_reads == 1


def test_a_long_span_is_charged_its_cpu_exactly() -> None:
    c = _Clocks()
    m = _budget(c).meter(Tenant(id="t"))
    m.run(c.work, 0.003, 0.004)  # preempted 4 ms: not charged
    m.run(c.work, 0.001)
    assert c.cpu_reads == 2
    assert m.cpu_s == pytest.approx(0.004)


def test_the_shortcut_needs_clocks_where_wall_bounds_cpu() -> None:
    assert CpuBudget(LimitsConfig()).wall_exact_s == CpuMeter.WALL_EXACT_S  # the real clocks
    fake = CpuBudget(LimitsConfig(), cpu_clock=lambda: 0.0)
    assert fake.wall_exact_s < 0  # a fake CPU clock: always read twice
    real = CpuBudget(LimitsConfig())
    m = real.meter(Tenant(id="t"))
    t0 = time.thread_time()
    m.run(sum, range(1000))
    m.run(sum, range(1000))
    assert 0 <= m.cpu_s <= max(CpuMeter.WALL_EXACT_S, time.thread_time() - t0 + 1e-3)
