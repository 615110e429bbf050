"""Issue 16 / session 8: the Redis scripts do less per request without changing what they decide.

- a request admitted without its slot (flow control) leaves the tenant's slot set untouched;
- ``take_slots`` runs the slot-only script: the count across instances still holds, a refused take
  adds nothing, and the slots still expire with the lease;
- a batch of more sequences than one ``ZADD`` call takes (members added in chunks of 500) is
  charged and released whole;
- zero increments of the ledger totals are not written, and the totals still read as before.
"""

from __future__ import annotations

import redis.asyncio as aioredis
import pytest

from gateway.config import StateConfig
from tenancy.limits import ConcurrencyLimited
from tenancy.registry import Tenant
from tenancy.shared import make_limits
from tests.support.waiting import wait_for


def _cfg(url: str, **kw: object) -> StateConfig:
    return StateConfig(backend="redis", url=url, key_prefix="pgs8:", **kw)


CONC = "pgs8:{t:t8}:conc"


async def test_admission_without_a_slot_leaves_the_slot_set_alone_and_the_slot_script_counts(redis_server) -> None:
    a, b = make_limits(_cfg(redis_server.url, lease_ttl_s=0.6)), make_limits(_cfg(redis_server.url, lease_ttl_s=0.6))
    client = aioredis.Redis.from_url(redis_server.url)
    tenant = Tenant(id="t8", rate_rps=1000, rate_burst=1000, max_concurrency=2)
    try:
        before = await _zset_calls(client)
        la = await a.limiter.admit(tenant, slot=False)
        lb = await b.limiter.admit(tenant, slot=False)
        after = await _zset_calls(client)
        # the slot set is neither pruned, read nor renewed: only each request bucket's expiry is set
        assert {k: v - before.get(k, 0) for k, v in after.items()} == {"cmdstat_pexpire": 2}
        assert not await client.exists(CONC)
        await a.limiter.take_slots(tenant, la, 1)
        await b.limiter.take_slots(tenant, lb, 1)
        assert await client.zcard(CONC) == 2
        lc = await a.limiter.admit(tenant, slot=False)
        with pytest.raises(ConcurrencyLimited):
            await b.limiter.take_slots(tenant, lc, 1)
        assert await client.zcard(CONC) == 2  # the refused take added nothing
        assert 0 < await client.pttl(CONC) <= 3 * 600
        lb.release()
        await b.flush()
        await a.limiter.take_slots(tenant, lc, 1)  # the freed slot, taken through the other instance
        assert await a.limiter.in_flight("t8") == 2
        # not renewed (no renewer started): the slots expire with the lease
        await wait_for(lambda: _zero(a, "t8"), what="slots expired after lease_ttl_s", timeout_s=5)
    finally:
        for x in (a, b):
            await x.aclose()
        await client.aclose()


async def _zset_calls(client: aioredis.Redis) -> dict[str, int]:
    stats = await client.info("commandstats")
    return {k: v["calls"] for k, v in stats.items() if k.startswith("cmdstat_z") or k == "cmdstat_pexpire"}


async def _zero(limits, tid: str) -> bool:
    return await limits.limiter.in_flight(tid) == 0


async def test_a_batch_larger_than_one_zadd_chunk_is_charged_and_released_whole(redis_server) -> None:
    a = make_limits(_cfg(redis_server.url))
    tenant = Tenant(id="t8", rate_rps=1e6, rate_burst=1e6, max_concurrency=5000)
    try:
        lease = await a.limiter.admit(tenant)
        await a.limiter.add_sequences(tenant, lease, 1203)
        assert await a.limiter.in_flight("t8") == 1204
        other = await a.limiter.admit(tenant, slot=False)
        await a.limiter.take_slots(tenant, other, 1100)
        assert await a.limiter.in_flight("t8") == 2304
        with pytest.raises(ConcurrencyLimited):
            await a.limiter.take_slots(tenant, other, 2697)
        assert await a.limiter.in_flight("t8") == 2304
        lease.release()
        other.release()
        await a.flush()
        assert await a.limiter.in_flight("t8") == 0
    finally:
        await a.aclose()


async def test_zero_increments_are_not_written_and_totals_read_the_same(redis_server) -> None:
    a = make_limits(_cfg(redis_server.url))
    client = aioredis.Redis.from_url(redis_server.url)
    tenant = Tenant(id="t8", rate_rps=1000)
    try:
        r1 = await a.ledger.reserve(tenant, 100, 0)
        r1.settle(100, 0, "usage")
        r2 = await a.ledger.reserve(tenant, 50, 20)
        r2.lower_output(5)
        r2.settle(40, 5, "usage")
        await a.flush()
        fields = {k.decode(): int(v) for k, v in (await client.hgetall("pgs8:{t:t8}:led:tot")).items()}
        assert fields == {"reserved_prompt": 150, "reserved_output": 20, "open": 0, "charged_prompt": 140,
                          "charged_output": 5, "refunded_prompt": 10, "refunded_output": 15}
        totals = (await a.ledger.totals())["t8"]
        assert totals.reserved == {"prompt": 150, "output": 20}
        assert totals.charged == {"prompt": 140, "output": 5}
        assert totals.refunded == {"prompt": 10, "output": 15}
        assert totals.open_reservations == 0
    finally:
        await a.aclose()
        await client.aclose()
