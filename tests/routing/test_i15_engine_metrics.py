"""Issue 15: the gateway reads a replica's engine metrics from its real ``/metrics``."""

from __future__ import annotations

import asyncio

import aiohttp

from gateway.engine_metrics import EngineMetricsPoller
from gateway.replicas import Replica, ReplicaSet
from routing.calibration import Calibration
from sim.replica import STATE_KEY, ReplicaConfig, create_app, run_app_on


def test_poller_stores_the_replicas_engine_sample_and_skips_a_dead_one() -> None:
    async def go() -> None:
        app = create_app(ReplicaConfig(replica_id="a"))
        runner, url = await run_app_on(app, "127.0.0.1", 0)
        app[STATE_KEY].running, app[STATE_KEY].waiting = 3, 4
        try:
            rs = ReplicaSet([Replica("a", url), Replica("dead", "http://127.0.0.1:9")])
            cal = Calibration()
            async with aiohttp.ClientSession() as session:
                poller = EngineMetricsPoller(rs, session, cal, interval_s=1.0, timeout_s=2.0)
                assert await poller.scrape("a")
                assert not await poller.scrape("dead")
            est = cal.estimate("a")
            assert est is not None and not est.calibrated  # metrics only: the rate is still the prior
            assert est.engine is not None and (est.engine.engine, est.engine.running, est.engine.waiting) == (
                "vllm", 3.0, 4.0)
            assert cal.estimate("dead") is None
        finally:
            await runner.cleanup()

    asyncio.run(go())
