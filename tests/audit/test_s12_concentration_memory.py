"""Session 12: the concentration monitor's memory does not grow with the request rate over its
600 s hit-rate baseline, and its window's observations are not tracked by the garbage collector
(audit/concentration.py; found by helper gwaudit: at 2,000 requests/s the baseline kept 1.2 million
GC-tracked objects, ~150-200 MB, and every full collection walked them)."""

from __future__ import annotations

import gc
import random
import tracemalloc

from audit.concentration import ConcentrationMonitor


def _feed(mon: ConcentrationMonitor, n: int, rate_per_s: float, seed: int = 0) -> float:
    rnd = random.Random(seed)
    t = 0.0
    for i in range(n):
        t = i / rate_per_s
        prompt = rnd.randint(16, 512)
        mon.observe("p", f"r{i % 4}", prompt // 2, prompt, rnd.randint(0, prompt), t, tenant=f"t{i % 3}")
    return t


def test_the_baseline_holds_sums_per_second_not_one_entry_per_request() -> None:
    """window 1 s, baseline 600 windows: 100,000 requests over 100 s used to stay in the baseline
    (all of them, ~10 MB); per-second sums hold ~100 entries."""
    mon = ConcentrationMonitor(window_s=1.0, baseline_windows=600, eval_interval_s=1.0)
    _feed(mon, 2_000, 1_000.0)  # warm: dicts, gauges, children
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        _feed(mon, 100_000, 1_000.0, seed=1)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 1_000_000, grown


def test_window_observations_are_not_tracked_by_the_collector() -> None:
    mon = ConcentrationMonitor(window_s=60.0, baseline_windows=10, eval_interval_s=1.0)
    _feed(mon, 1_000, 1_000.0)
    gc.collect()
    before = len(gc.get_objects())
    _feed(mon, 30_000, 1_000.0, seed=2)  # all 30 s stay in the 60 s window
    gc.collect()  # tuples of atomic values are untracked by a collection
    assert len(gc.get_objects()) - before < 1_000


def test_the_baseline_hit_rate_is_the_sums_of_the_seconds_it_covers() -> None:
    rnd = random.Random(3)
    mon = ConcentrationMonitor(window_s=2.0, baseline_windows=5, eval_interval_s=0.0)  # baseline 10 s
    seen: list[tuple[float, int, int]] = []
    t = 0.0
    for _ in range(3_000):
        t += rnd.expovariate(40.0)
        prompt, cached = rnd.randint(1, 400), 0
        cached = rnd.randint(0, prompt)
        mon.observe("p", f"r{rnd.randint(0, 2)}", prompt - cached, prompt, cached, t)
        seen.append((t, prompt, cached))
        if rnd.random() < 0.05:
            # a second [s, s + 1) stays while any of it is within 10 s of now
            kept = [(p, c) for (u, p, c) in seen if (u - u % 1.0) + 1.0 > t - 10.0]
            want = sum(c for _, c in kept) / sum(p for p, _ in kept)
            assert abs(mon.stats("p")["baseline_hit_rate"] - want) < 1e-9
