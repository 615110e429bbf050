"""Issue 16 / session 10: fewer Redis commands per request inside the limits' scripts, same decisions.

- admission of a tenant without a prompt-token rate does not read the ledger's prompt-token bucket
  (the early check ignores it: ``tenancy.prompt_room.shared_room``); with a rate it still does;
- a reservation without token rates does not read the server clock (``TIME``); with one it does;
- a settle lowers the open-reservation count with one ``HINCRBY`` (no ``HGET`` + ``HSET``) and still
  never below 0, also when the totals hash was lost (an emptied Redis).
"""

from __future__ import annotations

import redis.asyncio as aioredis

from gateway.config import StateConfig
from tenancy.registry import Tenant
from tenancy.shared import make_limits

TOT = "pgs10:{t:t10}:led:tot"


def _cfg(url: str) -> StateConfig:
    return StateConfig(backend="redis", url=url, key_prefix="pgs10:")


async def _calls(client: aioredis.Redis) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in (await client.info("commandstats")).items()}


async def _delta(client: aioredis.Redis, before: dict[str, int]) -> dict[str, int]:
    after = await _calls(client)
    return {k: v - before.get(k, 0) for k, v in after.items() if v - before.get(k, 0) and k != "info"}


async def test_admission_reads_the_prompt_bucket_only_for_a_tenant_with_a_prompt_rate(redis_server) -> None:
    a = make_limits(_cfg(redis_server.url))
    client = aioredis.Redis.from_url(redis_server.url)
    plain = Tenant(id="t10", rate_rps=1000, rate_burst=1000)
    metered = Tenant(id="t10m", rate_rps=1000, rate_burst=1000, prompt_tokens_per_s=10, prompt_tokens_burst=100)
    try:
        before = await _calls(client)
        (await a.limiter.admit(plain, slot=False)).release()
        d = await _delta(client, before)
        assert d["hmget"] == 1  # the request bucket only (was 2: the absent prompt bucket too)
        # a metered tenant: the admit reply still carries its prompt bucket (early debt check)
        r = await a.ledger.reserve(metered, 80, 0)
        r.settle(80, 0, "usage")
        await a.flush()
        before = await _calls(client)
        lease = await a.limiter.admit(metered, slot=False)
        assert (await _delta(client, before))["hmget"] == 2
        assert lease.prompt_bucket is not None and 15 <= lease.prompt_bucket[0] <= 30
        room = lease.prompt_room(metered)
        assert room is not None and room.cap < 100
        lease.release()
    finally:
        await a.aclose()
        await client.aclose()


async def test_a_reservation_without_token_rates_reads_no_clock_and_a_settle_no_open_count(redis_server) -> None:
    a = make_limits(_cfg(redis_server.url))
    client = aioredis.Redis.from_url(redis_server.url)
    tenant = Tenant(id="t10", rate_rps=1000)
    try:
        before = await _calls(client)
        r1 = await a.ledger.reserve(tenant, 100, 16)
        r2 = await a.ledger.reserve(tenant, 10, 4)
        d = await _delta(client, before)
        assert "time" not in d and "hmget" not in d, d
        assert int(await client.hget(TOT, "open")) == 2
        before = await _calls(client)
        r1.settle(90, 16, "usage")
        await a.flush()
        d = await _delta(client, before)
        assert "hget" not in d and "hset" not in d  # open 2 -> 1 in one HINCRBY
        assert int(await client.hget(TOT, "open")) == 1
        # the totals lost meanwhile (emptied Redis): open is clamped at 0, not -1
        await client.delete(TOT)
        r2.settle(10, 4, "usage")
        await a.flush()
        totals = (await a.ledger.totals())["t10"]
        assert totals.open_reservations == 0
        assert totals.charged == {"prompt": 10, "output": 4}
        # a limited tenant still refills on the server clock
        limited = Tenant(id="t10", rate_rps=1000, prompt_tokens_per_s=1000, prompt_tokens_burst=1000)
        before = await _calls(client)
        (await a.ledger.reserve(limited, 10, 0)).settle(10, 0, "usage")
        await a.flush()
        assert (await _delta(client, before)).get("time", 0) >= 1
    finally:
        await a.aclose()
        await client.aclose()
