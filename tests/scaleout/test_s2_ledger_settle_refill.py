"""The Redis ledger refills a bucket to the settle time before applying a settle's overshoot
or refund, like the in-process ledger (tenancy/shared_lua.py ADJUST; issue 16).

Before the fix the Redis script applied the overshoot to the stored (stale) level, so
tokens that accrued between the reservation and the settle absorbed the overshoot.
"""
from __future__ import annotations

import pytest
import redis.asyncio

from gateway.config import StateConfig
from tenancy.ledger import InProcessLedger
from tenancy.registry import Tenant
from tenancy.shared import make_limits
from tests.support.waiting import wait_for


def _cfg(url: str) -> StateConfig:
    return StateConfig(backend="redis", url=url, key_prefix="pgrefill:")


async def _server_time(client) -> float:
    s, us = await client.time()
    return s + us / 1e6


async def test_an_overshoot_settled_later_is_charged_on_the_server_clock(redis_server) -> None:
    shared = make_limits(_cfg(redis_server.url))
    client = redis.asyncio.Redis.from_url(redis_server.url)
    try:
        t = Tenant(id="acme", output_tokens_per_s=100.0, output_tokens_burst=40)
        t0 = await _server_time(client)
        res = await shared.ledger.reserve(t, 0, 41)  # full bucket 40 -> -1 (need = the burst)
        await wait_for(lambda: _later(client, t0 + 0.5), what="0.5 s of server time")
        res.settle(0, 130, "usage")  # 89 beyond the reservation
        await shared.flush()
        level = await shared.ledger.level("acme", "output")
        # refilled to the settle time (full: 40) then 89 of debt: -49 plus what accrued since;
        # without the refill: -1 - 89 = -90 plus 100/s x >= 0.5 s  ->  about -40
        assert -49.5 < level < -45, level
    finally:
        await shared.aclose()
        await client.aclose()


async def _later(client, t: float) -> bool:
    return await _server_time(client) >= t


@pytest.mark.parametrize("refill_read", [False, True])
async def test_settle_on_an_injected_clock_equals_the_in_process_ledger(redis_server, refill_read: bool) -> None:
    now = [0.0]
    shared = make_limits(_cfg(redis_server.url), clock=lambda: now[0])
    local = InProcessLedger(clock=lambda: now[0])
    try:
        t = Tenant(id="acme", output_tokens_per_s=1.0, output_tokens_burst=40)
        pair = [local.reserve(t, 0, 41), await shared.ledger.reserve(t, 0, 41)]
        now[0] = 1000.0
        if refill_read:  # a read before the settle must not change the outcome any more
            assert local.level("acme", "output") == await shared.ledger.level("acme", "output") == 40.0
        for r in pair:
            r.settle(0, 130, "usage")
        await shared.flush()
        assert local.level("acme", "output") == await shared.ledger.level("acme", "output") == -49.0
    finally:
        await shared.aclose()
