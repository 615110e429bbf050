"""Session 20, helper fixreg (S19-FP1): a remote OPA's health probe has its own deadline, ``health_timeout_s``.

The probe (``RemoteOpa.health`` -> ``GET /health``) runs on the decision session, whose aiohttp total timeout is
one decision's deadline ``timeout_s`` (0.2 s by default); until session 20 that total cut the probe, so
``gateway/pep.py``'s ``health_timeout_s = max(timeout_s, 0.5)`` (docs/configuration.md) never applied. The probe
now passes aiohttp's per-request ``timeout`` (``_OpaClient.health_ok``).

The OPA stand-in holds ``/health`` on events, not sleeps: its answer comes only after a decision started after
the probe has run into its whole deadline, so the probe provably lasted longer than ``timeout_s``.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from policy.decision import PolicyUnavailableError
from policy.remote import RemoteOpa


class SlowHealthOpa:
    """An OPA stand-in: ``/health`` answers 200 when ``release`` is set; decisions never answer."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.health_seen = asyncio.Event()
        self.gone = asyncio.Event()  # set at cleanup: every held handler returns
        self.url = ""

    async def _until(self, event: asyncio.Event) -> None:
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self.gone.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def health(self, request: web.Request) -> web.Response:
        self.health_seen.set()
        await self._until(self.release)
        return web.json_response({})

    async def decide(self, request: web.Request) -> web.Response:
        await self.gone.wait()
        return web.json_response({"result": {"allow": True}})


@pytest.fixture
async def opa() -> AsyncIterator[SlowHealthOpa]:
    stand_in = SlowHealthOpa()
    app = web.Application()
    app.router.add_get("/health", stand_in.health)
    app.router.add_post("/v1/data/{path:.*}", stand_in.decide)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    stand_in.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield stand_in
    stand_in.gone.set()
    await runner.cleanup()


async def test_a_health_answer_slower_than_a_decision_deadline_is_healthy(opa: SlowHealthOpa) -> None:
    async with RemoteOpa(opa.url, timeout_s=0.1, health_timeout_s=60.0) as remote:
        probe = asyncio.ensure_future(remote.health())
        await asyncio.wait_for(opa.health_seen.wait(), 10)
        with pytest.raises(PolicyUnavailableError):  # a decision started after the probe: its whole deadline
            await remote.decide({"x": 1})
        assert not probe.done(), f"the probe was cut at the decision deadline: {probe.result()}"
        opa.release.set()
        assert await probe == (True, "")


async def test_a_health_answer_past_its_own_deadline_is_not_ready(opa: SlowHealthOpa) -> None:
    async with RemoteOpa(opa.url, timeout_s=0.1, health_timeout_s=0.3) as remote:
        ok, reason = await remote.health()  # /health never answers
        assert (ok, reason) == (False, "OPA health check exceeded 0.3s")


async def test_an_unreachable_opa_is_not_ready() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()
    async with RemoteOpa(f"http://127.0.0.1:{port}", timeout_s=0.1, health_timeout_s=5.0) as remote:
        ok, reason = await remote.health()
        assert not ok and reason.startswith("OPA health check failed")
