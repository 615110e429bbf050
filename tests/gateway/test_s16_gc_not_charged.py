"""F16-1: a tenant's CPU meter is not charged for the cyclic garbage collector's older generations.

A generation-2 collection (tens of ms on the CI machine) runs in whatever request's span crosses the
threshold; it collects every tenant's garbage, so charging it to that span's tenant put tenants in
debt for CPU they did not cause (the F15-1 flake). ``gateway/gc_time.py`` counts it; the meter
subtracts it.
"""

from __future__ import annotations

import gc
import threading
import time

from gateway.config_http import LimitsConfig
from gateway.cpu_budget import CpuBudget
from gateway.gc_time import GC_TIME, GcTime
from tenancy.registry import Tenant


def _cyclic_garbage(n: int = 200_000) -> None:
    """Unreachable reference cycles only the cyclic collector frees."""
    for _ in range(n):
        a: list = []
        a.append(a)


def _tenant() -> Tenant:
    return Tenant(id="t1")


def test_gc_time_counts_older_generations_on_its_thread_only() -> None:
    clock = GcTime().install()
    try:
        gc.collect()
        before = clock.total_s
        _cyclic_garbage()
        gc.collect(2)
        after_full = clock.total_s
        assert after_full > before  # a full collection of 200k cycles took measurable CPU

        done = threading.Event()

        def other() -> None:
            _cyclic_garbage()
            gc.collect(2)
            done.set()

        t = threading.Thread(target=other)
        t.start()
        t.join()
        assert done.is_set()
        assert clock.total_s == after_full  # the other thread's collection is not the loop's CPU

        _cyclic_garbage(1000)
        gc.collect(0)
        assert clock.total_s == after_full  # generation 0 stays in the span
    finally:
        clock.uninstall()


def test_meter_does_not_charge_a_full_collection_in_the_span() -> None:
    budget = CpuBudget(LimitsConfig(refused_cpu_ms_per_s=100, refused_cpu_burst_ms=1000))
    assert budget.gc_time is GC_TIME  # real clocks: the process's collector clock
    meter = budget.meter(_tenant())
    gc.collect()
    _cyclic_garbage(300_000)
    g0, c0 = GC_TIME.total_s, time.thread_time()
    meter.run(gc.collect, 2)
    meter.run(lambda: None)  # the second step closes the span
    gc_s, step_cpu = GC_TIME.total_s - g0, time.thread_time() - c0
    assert gc_s > 0.0
    assert step_cpu >= gc_s  # the span really held the collection ...
    assert meter.cpu_s < 0.5 * gc_s  # ... and the tenant is not charged for it (before F16-1: cpu_s >= gc_s)


def test_fake_cpu_clock_never_subtracts_the_collector() -> None:
    cpu = [0.0]
    budget = CpuBudget(LimitsConfig(refused_cpu_ms_per_s=100, refused_cpu_burst_ms=1000),
                       cpu_clock=lambda: cpu[0])
    assert budget.gc_time is not GC_TIME
    meter = budget.meter(_tenant())

    def step() -> None:
        _cyclic_garbage(50_000)
        gc.collect(2)
        cpu[0] += 0.004

    meter.run(step)
    meter.run(lambda: None)
    assert abs(meter.cpu_s - 0.004) < 1e-9
