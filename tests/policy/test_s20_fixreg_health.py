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

from policy.decision import PolicyUnavailableError
from policy.remote import RemoteOpa
from tests.support.opa_standin import StandInOpa, serving_opa


class SlowHealthOpa(StandInOpa):
    """An OPA stand-in: ``/health`` answers 200 when ``release`` is set; decisions never answer."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()
        self.health_seen = asyncio.Event()

    async def before_health(self) -> None:
        self.health_seen.set()
        await self.until(self.release)

    async def before_decide(self) -> None:
        await self.gone.wait()


@pytest.fixture
async def opa() -> AsyncIterator[SlowHealthOpa]:
    async with serving_opa(SlowHealthOpa()) as stand_in:
        yield stand_in


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
