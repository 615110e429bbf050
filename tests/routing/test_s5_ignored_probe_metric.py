"""Ignored health-probe timeouts are counted (session-4 leftover: they were only logged at debug).

A probe that times out while real traffic to the replica succeeded within
``health.passive_grace_s`` does not count against the replica; the callback
(wired to ``prefixgate_health_probe_timeouts_ignored{replica}`` on the admin
registry) makes such a replica visible to operators.
"""

from __future__ import annotations

import aiohttp
from prometheus_client import generate_latest

from gateway.health import HealthChecker
from gateway.metrics import GatewayMetrics
from gateway.replicas import Replica, ReplicaSet
from tests.routing.test_s4_passive_health import Clock, SlowHealth


async def test_each_ignored_probe_timeout_is_reported_and_counted_ones_are_not() -> None:
    clock = Clock()
    metrics = GatewayMetrics()
    seen: list[str] = []

    def ignored(rid: str) -> None:
        seen.append(rid)
        metrics.health_probe_timeouts_ignored.labels(rid).inc()

    async with SlowHealth() as fake, aiohttp.ClientSession() as session:
        rs = ReplicaSet([Replica("r1", fake.url)], failure_threshold=3, clock=clock)
        hc = HealthChecker(rs, session, interval_s=1, timeout_s=0.05, unhealthy_after=2,
                           passive_grace_s=5.0, on_ignored_timeout=ignored)
        fake.delay_s = 1.0
        rs.attempt("r1").succeeded()
        await hc.check_once()
        await hc.check_once()
        assert seen == ["r1", "r1"] and rs.state("r1").healthy
        clock.t += 5.1  # real traffic is old now: the next timeout counts, and is not reported as ignored
        await hc.check_once()
        assert seen == ["r1", "r1"]
    text = generate_latest(metrics.admin).decode()
    assert 'prefixgate_health_probe_timeouts_ignored_total{replica="r1"} 2.0' in text
    assert "prefixgate_health_probe_timeouts_ignored" not in generate_latest(metrics.public).decode()
