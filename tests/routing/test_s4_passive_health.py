"""Passive health beside the active probe (session 4).

The ``GET /health`` probe runs on the gateway's event loop: under CPU saturation it can time
out although the replica is fine. As with Envoy's outlier detection, real traffic is evidence
too: a probe that *times out* is not counted against a replica whose last real answer was a
success no longer than ``passive_grace_s`` ago. An explicit bad answer to the probe (5xx,
refused connection) still counts, and real failures are counted by the breaker:
``breaker_failures`` consecutive ones take the replica out of rotation, and void the grace."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from gateway.health import HealthChecker
from gateway.replicas import Replica, ReplicaSet


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class SlowHealth:
    """A /health endpoint that answers 200, after ``delay_s`` (longer than the probe timeout:
    a probe starved by a busy loop looks the same to the checker), or with ``status``."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.status = 200
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def health(self, request: web.Request) -> web.Response:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return web.json_response({"status": "ok", "instance_id": "i1"}, status=self.status)

    async def __aenter__(self) -> SlowHealth:
        app = web.Application()
        app.router.add_get("/health", self.health)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        self.url = f"http://127.0.0.1:{self.runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()


@pytest.fixture
async def env():
    clock = Clock()
    async with SlowHealth() as fake, aiohttp.ClientSession() as session:
        rs = ReplicaSet([Replica("r1", fake.url)], failure_threshold=3, clock=clock)
        hc = HealthChecker(rs, session, interval_s=1, timeout_s=0.05, unhealthy_after=2, healthy_after=1,
                           passive_grace_s=5.0)
        yield fake, rs, hc, clock


async def test_probe_timeouts_while_real_requests_succeed_do_not_mark_the_replica_down(env) -> None:
    fake, rs, hc, clock = env
    fake.delay_s = 1.0  # every probe times out
    for _ in range(4):
        rs.attempt("r1").succeeded()  # real traffic keeps being answered
        clock.t += 1.0
        await hc.check_once()
        assert rs.state("r1").healthy and rs.is_routable("r1")


async def test_probe_timeouts_count_once_real_traffic_is_old(env) -> None:
    fake, rs, hc, clock = env
    fake.delay_s = 1.0
    rs.attempt("r1").succeeded()
    clock.t += 5.1  # the last real answer is older than the grace
    await hc.check_once()
    assert rs.state("r1").healthy  # unhealthy_after = 2
    await hc.check_once()
    assert not rs.state("r1").healthy


async def test_probe_timeouts_count_without_any_real_traffic(env) -> None:
    fake, rs, hc, _ = env
    fake.delay_s = 1.0
    await hc.check_once()
    await hc.check_once()
    assert not rs.state("r1").healthy


async def test_an_explicit_bad_probe_answer_counts_despite_recent_traffic(env) -> None:
    fake, rs, hc, _ = env
    hc.timeout_s = 30.0  # the 503 must arrive as an answer, not as a timeout on a loaded machine
    fake.status = 503  # the replica says it is not well (e.g. draining): believed at once
    rs.attempt("r1").succeeded()
    await hc.check_once()
    await hc.check_once()
    assert not rs.state("r1").healthy


async def test_consecutive_real_failures_take_it_out_and_void_the_grace(env) -> None:
    fake, rs, hc, clock = env
    rs.attempt("r1").succeeded()
    for _ in range(3):  # breaker_failures consecutive real failures
        rs.attempt("r1").failed()
    assert not rs.is_routable("r1")  # ejected by the breaker (outlier detection)
    fake.delay_s = 1.0
    await hc.check_once()
    await hc.check_once()
    assert not rs.state("r1").healthy  # the recent success no longer shields it: a failure followed
    # ... and a timed-out probe after the cool-down does not bring it back either
    clock.t += 10
    await hc.check_once()
    assert not rs.state("r1").healthy and not rs.is_routable("r1")


def test_grace_must_not_be_negative() -> None:
    with pytest.raises(ValueError):
        HealthChecker(ReplicaSet([]), None, passive_grace_s=-1)  # type: ignore[arg-type]


async def test_grace_zero_turns_passive_health_off(env) -> None:
    fake, rs, hc, _ = env
    hc.passive_grace_s = 0.0
    fake.delay_s = 1.0
    rs.attempt("r1").succeeded()
    await hc.check_once()
    await hc.check_once()
    assert not rs.state("r1").healthy  # the behaviour before session 4: probe timeouts alone decide
