"""Issue 14 (session 6): the preparation CPU meter reads the thread-CPU clock twice a request.

The two steps (parse, tokenize) are one measured span; a long gap between them (an await that
may have run other requests) cuts the span so their CPU is not charged to this request.
"""

from __future__ import annotations

import pytest

from gateway.config_http import LimitsConfig
from gateway.cpu_budget import CpuBudget
from tenancy.registry import Tenant


class _Clocks:
    def __init__(self) -> None:
        self.now, self.cpu, self.wall, self.cpu_reads = 100.0, 0.0, 0.0, 0

    def read_cpu(self) -> float:
        self.cpu_reads += 1
        return self.cpu

    def work(self, s: float) -> None:  # this thread runs for s seconds
        self.cpu += s
        self.wall += s


def _budget(c: _Clocks) -> CpuBudget:
    return CpuBudget(LimitsConfig(refused_cpu_ms_per_s=100, refused_cpu_burst_ms=1000), clock=lambda: c.now,
                     cpu_clock=c.read_cpu, wall_clock=lambda: c.wall)


def test_two_steps_read_the_cpu_clock_twice_and_measure_both() -> None:
    c = _Clocks()
    m = _budget(c).meter(Tenant(id="t"))
    m.run(c.work, 0.003)
    c.work(0.000005)  # the request's own checks between the steps (sync, 5 us)
    m.run(c.work, 0.002)
    assert c.cpu_reads == 2
    assert m.cpu_s == pytest.approx(0.005005)
    m.settle(True, 0)
    assert c.cpu_reads == 2


def test_a_long_gap_between_the_steps_is_not_charged() -> None:
    c = _Clocks()
    m = _budget(c).meter(Tenant(id="t"))
    m.run(c.work, 0.003)
    c.work(0.050)  # an await ran other requests for 50 ms of this thread's CPU
    m.run(c.work, 0.002)
    assert m.cpu_s == pytest.approx(0.005)
    assert c.cpu_reads == 3


def test_refusal_between_the_steps_charges_the_first_step() -> None:
    c = _Clocks()
    b = _budget(c)
    m = b.meter(Tenant(id="t"))
    m.run(c.work, 0.004)
    c.work(0.000002)
    m.refused()  # e.g. check_request: a model the tenant may not use
    assert b.buckets["t"].level == pytest.approx(1.0 - 0.004002)
    c2 = _Clocks()
    b2 = _budget(c2)
    m2 = b2.meter(Tenant(id="t"))
    m2.run(c2.work, 0.004)
    c2.work(0.5)  # awaited (batch admission) before being refused: others' work not charged
    m2.refused()
    assert b2.buckets["t"].level == pytest.approx(1.0 - 0.004)


def test_a_raising_step_is_measured_exactly() -> None:
    c = _Clocks()
    m = _budget(c).meter(Tenant(id="t"))

    def boom() -> None:
        c.work(0.007)
        raise ValueError("x")

    with pytest.raises(ValueError):
        m.run(boom)
    assert m.cpu_s == pytest.approx(0.007) and c.cpu_reads == 2
