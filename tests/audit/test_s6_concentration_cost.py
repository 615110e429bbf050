"""Issue 14 (session 6): the concentration monitor sets a gauge only when its value changed.

Every gauge must still show the window's current figures (:meth:`ConcentrationMonitor.stats`)
after every observation: shares moving as a second replica takes traffic, the hit rate, the
window expiring. With one replica and steady traffic nothing changes, so nothing is set.
"""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import Gauge

from audit.concentration import ConcentrationMonitor


def _gauges_match_stats(mon: ConcentrationMonitor, pub: CollectorRegistry, adm: CollectorRegistry,
                        pool: str) -> None:
    st = mon.stats(pool)
    assert pub.get_sample_value("prefixgate_pool_concentration_hhi", {"pool": pool}) == st["hhi"]
    assert adm.get_sample_value("prefixgate_pool_max_mean_ratio", {"pool": pool}) == st["max_mean_ratio"]
    if st["hit_rate"] is not None:
        assert pub.get_sample_value("prefixgate_pool_prefix_hit_rate", {"pool": pool}) == st["hit_rate"]
    for r, share in st["shares"].items():  # type: ignore[attr-defined]
        labels = {"pool": pool, "replica": r}
        assert adm.get_sample_value("prefixgate_replica_request_share", labels) == share
        assert adm.get_sample_value("prefixgate_replica_prefill_share", labels) == st["prefill_shares"][r]  # type: ignore[index]


def test_gauges_follow_every_change_of_the_window() -> None:
    pub, adm = CollectorRegistry(), CollectorRegistry()
    mon = ConcentrationMonitor(window_s=5.0, registry=pub, admin_registry=adm, pools={"p": ["a"]})
    rng = random.Random(7)
    now = 0.0
    for i in range(600):
        now += rng.random() * 0.05
        replica = "a" if i < 100 else rng.choice(["a", "a", "b", "c"])  # b and c appear later
        prompt = rng.randint(1, 400)
        cached = rng.randint(0, prompt) if i % 3 else 0
        mon.observe("p", replica, prompt - cached, prompt, cached, now, tenant=rng.choice(["t1", "t2", None]))
        _gauges_match_stats(mon, pub, adm, "p")
    now += 10.0  # all but the next observation expire
    mon.observe("p", "c", 10, 10, 10, now)
    _gauges_match_stats(mon, pub, adm, "p")
    assert mon.stats("p")["requests"] == 1


def test_steady_one_replica_traffic_sets_nothing_after_the_first_observation(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    mon = ConcentrationMonitor(pools={"p": ["a"]})
    calls = []
    real = Gauge.set
    monkeypatch.setattr(Gauge, "set", lambda self, v: (calls.append(v), real(self, v)))
    for i in range(50):
        mon.observe("p", "a", 80, 80, 0, float(i), tenant="t")
    assert len(calls) == 5  # hhi, hit rate, max/mean, request share, prefill share: once each
    mon.observe("p", "a", 0, 80, 80, 50.0, tenant="t")  # the hit rate and nothing else moves
    assert len(calls) == 6
