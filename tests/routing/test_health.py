from __future__ import annotations

import aiohttp
from aiohttp import web

from gateway.health import HealthChecker
from gateway.replicas import Replica, ReplicaSet
from tests.support.waiting import wait_for


class FakeReplica:
    """Tiny loopback /health endpoint whose answer the test controls."""

    def __init__(self) -> None:
        self.status = 200
        self.instance_id = "inst-1"
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def health(self, request: web.Request) -> web.Response:
        if self.status != 200:
            return web.json_response({"status": "down"}, status=self.status)
        return web.json_response({"status": "ok", "instance_id": self.instance_id})

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/health", self.health)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def test_down_up_and_restart_detection() -> None:
    fake = FakeReplica()
    await fake.start()
    restarted: list[str] = []
    try:
        rs = ReplicaSet([Replica("r1", fake.url), Replica("dead", "http://127.0.0.1:1")])
        async with aiohttp.ClientSession() as session:
            hc = HealthChecker(
                rs, session, interval_s=0.05, timeout_s=5.0, unhealthy_after=2, healthy_after=2, on_restart=restarted.append
            )
            await hc.check_once()
            assert rs.state("r1").healthy and rs.state("r1").instance_id == "inst-1"
            assert rs.state("dead").healthy  # one failure is not enough
            await hc.check_once()
            assert not rs.state("dead").healthy
            assert rs.routable_ids() == ["r1"]

            fake.status = 503
            await hc.check_once()
            await hc.check_once()
            assert not rs.state("r1").healthy
            fake.status = 200
            await hc.check_once()
            assert not rs.state("r1").healthy  # healthy_after=2
            await hc.check_once()
            assert rs.state("r1").healthy
            assert restarted == []

            fake.instance_id = "inst-2"
            await hc.check_once()
            assert restarted == ["r1"]
            await hc.check_once()
            assert restarted == ["r1"]  # reported once per change
    finally:
        await fake.stop()


async def test_periodic_loop_start_stop() -> None:
    fake = FakeReplica()
    await fake.start()
    try:
        rs = ReplicaSet([Replica("r1", fake.url)])
        fake.status = 500
        async with aiohttp.ClientSession() as session:
            hc = HealthChecker(rs, session, interval_s=0.02, timeout_s=5.0, unhealthy_after=1, healthy_after=1)
            hc.start()
            # a condition, not ~2 s of polls: the first check may come late on a loaded machine
            await wait_for(lambda: not rs.state("r1").healthy, what="the periodic check marks r1 down")
            await hc.stop()
            assert not rs.state("r1").healthy
    finally:
        await fake.stop()
