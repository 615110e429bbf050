"""Micro-benchmark (session 11, R10-3): the calibration's per-request cost, this tree's per-tenant
fits vs a baseline tree's single fit per replica, in one process, interleaved (not a test).

``python -m bench.calibration_tenant_micro --baseline DIR [--rounds 15] [--tenants 8]``

``DIR`` holds the baseline tree (e.g. ``git archive main | tar -x -C DIR``); its
``routing/calibration.py`` is loaded under another module name next to this tree's (the modules it
imports are this tree's: unchanged by session 11). One "request" is what the gateway does per
request with calibration on: ``CalibratingLoadTracker.dispatch`` (this tree: with the tenant),
``first_byte``, ``finish``, the deferred ``flush`` and ``estimate`` of each of 6 replicas (the
router's candidates). Prints thread-CPU ns per request: the median over rounds (each round: best
of 5 loops of 2,000 requests, A and B alternating) per tree and their difference."""

from __future__ import annotations

import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import routing.calibration as new_cal
from routing.load import InProcessLoadTracker
from sim.click_options import ClickOptions

REPLICAS = [f"r{i}" for i in range(6)]


def _load_old(base: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("baseline_calibration", base / "routing" / "calibration.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["baseline_calibration"] = mod
    spec.loader.exec_module(mod)
    return mod


def _loop(mod: ModuleType, tenants: int, n: int, with_tenant: bool) -> float:
    rng = random.Random(7)
    work = [(REPLICAS[rng.randrange(6)], rng.randint(50, 3000), f"tenant-{rng.randrange(tenants)}")
            for _ in range(n)]
    now = [0.0]
    cal = mod.Calibration(prior_rate=10000.0)
    cal.defer_observations(True)
    loads = mod.CalibratingLoadTracker(InProcessLoadTracker(), cal, lambda: now[0])
    for rid, u, t in work[:500]:  # warm: every fit past min_samples
        tk = loads.dispatch(rid, u, 8, 1, t, True) if with_tenant else loads.dispatch(rid, u, 8, 1)
        now[0] += u / 10000 + 0.02
        tk.first_byte()
        tk.finish()
    cal.flush()
    best = float("inf")
    for _ in range(5):
        t0 = time.thread_time_ns()
        for rid, u, t in work:
            for r in REPLICAS:
                cal.estimate(r)
            tk = loads.dispatch(rid, u, 8, 1, t, True) if with_tenant else loads.dispatch(rid, u, 8, 1)
            now[0] += u / 10000 + 0.02
            tk.first_byte()
            tk.finish()
            cal.flush()
        best = min(best, (time.thread_time_ns() - t0) / n)
    return best


def main() -> int:
    """Run the interleaved A/B and print the table."""
    ap = ClickOptions(prog="python -m bench.calibration_tenant_micro", description=__doc__.splitlines()[0])
    ap.option("--baseline", required=True, help="the baseline tree")
    ap.option("--rounds", type=int, default=15)
    ap.option("--tenants", type=int, default=8)
    a = ap.parse()
    old = _load_old(Path(a.baseline))
    olds, news = [], []
    for _ in range(a.rounds):
        olds.append(_loop(old, a.tenants, 2000, False))
        news.append(_loop(new_cal, a.tenants, 2000, True))
    mo, mn = statistics.median(olds), statistics.median(news)
    print(f"tenants={a.tenants} rounds={a.rounds}: baseline {mo:.0f} ns/request (min {min(olds):.0f}, "
          f"max {max(olds):.0f}); this tree {mn:.0f} ns/request (min {min(news):.0f}, max {max(news):.0f}); "
          f"difference {mn - mo:+.0f} ns")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
