"""Session 12: the health and engine-metrics probes read at most their bound of a replica's body.

``GET /health`` and ``GET /metrics`` were read with ``resp.read()`` (a body of any size buffered) before
its decoded size was checked; an identity body was not checked at all. Now
:func:`gateway.health.read_at_most` stops at the bound (1 MiB, 4 MiB): the probe fails, the scrape is
skipped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from gateway.engine_metrics import MAX_METRICS_BYTES, EngineMetricsPoller
from gateway.health import PROBE_MAX_BYTES, HealthChecker
from gateway.replicas import Replica, ReplicaSet
from routing.calibration import Calibration

METRICS = b"vllm:num_requests_running 3\nvllm:num_requests_waiting 4\n"


@pytest.fixture
async def replica_url() -> AsyncIterator[str]:
    """A replica whose ``/health`` and ``/metrics`` bodies are padded past the probes' bounds when
    asked (under ``/big``), else small."""
    async def health(request: web.Request) -> web.Response:
        pad = b" " * (PROBE_MAX_BYTES + 1) if request.path.startswith("/big/") else b""
        return web.Response(body=b'{"instance_id": "i-1"}' + pad, content_type="application/json")

    async def metrics(request: web.Request) -> web.Response:
        pad = b"# padding\n" * (MAX_METRICS_BYTES // 10 + 1) if request.path.startswith("/big/") else b""
        return web.Response(body=pad + METRICS, content_type="text/plain")

    app = web.Application()
    for prefix in ("", "/big"):
        app.router.add_get(prefix + "/health", health)
        app.router.add_get(prefix + "/metrics", metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_a_health_body_past_the_bound_fails_the_probe(replica_url: str) -> None:
    rs = ReplicaSet([Replica("small", replica_url), Replica("big", replica_url + "/big")])
    async with aiohttp.ClientSession() as session:
        hc = HealthChecker(rs, session, timeout_s=5.0)
        assert await hc.probe("small") == "i-1"
        assert await hc.probe("big") is None  # before: "i-1" (the whole body buffered and parsed)


async def test_a_metrics_body_past_the_bound_is_not_scraped(replica_url: str) -> None:
    rs = ReplicaSet([Replica("small", replica_url), Replica("big", replica_url + "/big")])
    cal = Calibration()
    async with aiohttp.ClientSession() as session:
        poller = EngineMetricsPoller(rs, session, cal, timeout_s=5.0)
        assert await poller.scrape("small")
        assert not await poller.scrape("big")  # before: True (the whole body buffered and parsed)
    assert cal.estimate("big") is None
