from __future__ import annotations

import random

from prometheus_client import generate_latest

from audit.concentration import ConcentrationMonitor
from audit.event import Outcome


def _run(mon: ConcentrationMonitor, pick, seconds: float, t0: float = 0.0, rate: int = 20, hit: float = 0.6) -> float:
    t = t0
    while t < t0 + seconds:
        r = pick()
        cached = int(100 * hit)
        mon.observe("p", r, prefill_tokens=100 - cached, prompt_tokens=100, cached_tokens=cached, now=t)
        t += 1 / rate
    return t


def test_balanced_stream_raises_nothing():
    alerts = []
    mon = ConcentrationMonitor(window_s=10, hold_s=5, on_alert=alerts.append)
    rng = random.Random(1)
    _run(mon, lambda: rng.choice("abcd"), 60)
    assert alerts == [] and mon.active_alerts() == []
    assert mon.stats("p")["hhi"] < 0.1


def test_skewed_stream_alerts_once_then_clears():
    alerts = []
    mon = ConcentrationMonitor(window_s=10, hold_s=5, on_alert=alerts.append)
    rng = random.Random(2)
    t = _run(mon, lambda: rng.choice("abcd"), 30)
    t = _run(mon, lambda: "a" if rng.random() < 0.8 else rng.choice("bcd"), 40, t0=t)
    raised = [a for a in alerts if a.outcome is Outcome.RAISED]
    kinds = sorted(a.alert["alert_kind"] for a in raised)
    assert kinds == ["pool_concentration", "replica_concentration"]  # once each, no flapping
    rep = next(a for a in raised if a.alert["alert_kind"] == "replica_concentration")
    assert rep.alert["replica"] == "a" and rep.alert["value"] >= 0.3125
    active = mon.active_alerts()
    assert {(a["kind"], a["replica"]) for a in active} == {("replica_concentration", "a"), ("pool_concentration", None)}
    _run(mon, lambda: rng.choice("abcd"), 40, t0=t)
    cleared = [a for a in alerts if a.outcome is Outcome.CLEARED]
    assert len(cleared) == 2 and mon.active_alerts() == []


def test_short_burst_below_hold_does_not_alert():
    alerts = []
    mon = ConcentrationMonitor(window_s=5, hold_s=20, on_alert=alerts.append)
    rng = random.Random(3)
    t = _run(mon, lambda: rng.choice("abcd"), 20)
    t = _run(mon, lambda: "a", 8, t0=t)
    _run(mon, lambda: rng.choice("abcd"), 20, t0=t)
    assert alerts == []


def test_cache_miss_spike_and_metrics_split():
    alerts = []
    mon = ConcentrationMonitor(window_s=5, hold_s=3, on_alert=alerts.append)
    rr = iter("abcd" * 10_000)  # perfectly even: only the hit rate changes
    t = _run(mon, lambda: next(rr), 40, hit=0.8)
    _run(mon, lambda: next(rr), 15, t0=t, hit=0.1)
    assert [a.alert["alert_kind"] for a in alerts] == ["cache_miss_spike"]
    public = generate_latest(mon.registry).decode()
    admin = generate_latest(mon.admin_registry).decode()
    assert 'replica="a"' not in public and "prefixgate_pool_prefix_hit_rate" in public
    assert 'replica="a"' in admin
