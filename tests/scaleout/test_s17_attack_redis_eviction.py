"""Session 17, helper attack (S17-9): a shared Redis that evicts keys (``maxmemory`` with an eviction policy,
e.g. a managed Redis's ``volatile-lru`` default, or ``allkeys-lru``) under memory pressure.

Live (/work/notes/s17-attack/evict.py, conc_check.py + filler.py; two gateways, ``maxmemory 8mb``):
``allkeys-lru`` with another writer filling memory: acme (``max_concurrency: 4``) ran 10 requests at once on
the replicas (its slot set was evicted; the 4-slot limit held at 4 without eviction); ``volatile-lru`` with
memory full of keys without TTL (the routing stream has none): every admission of every tenant failed
with OOM, 503 ``state_unavailable``. Nothing in docs/scale-out.md asks for ``noeviction`` or sizes
``maxmemory`` against ``state.stream_max_bytes`` (64 MiB by default, filled by tenants' traffic).
Here eviction is played by deleting the tenant's slot set, as Redis would; the renewal of the instance's
leases (``RENEW``: ``ZADD XX``) finds the slots gone, counts them lost and never puts them back.
"""
from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from tenancy.limits import ConcurrencyLimited
from tenancy.registry import Tenant
from tests.support.redis_server import slot_keys


async def test_the_concurrency_limit_holds_without_eviction(limits) -> None:
    t = Tenant(id="acme", max_concurrency=4)
    leases = [await limits.limiter.admit(t) for _ in range(4)]
    with pytest.raises(ConcurrencyLimited):
        await limits.limiter.admit(t)
    assert len(leases) == 4


async def test_slots_evicted_by_redis_are_restored_by_the_next_renewal(limits, redis_server) -> None:
    t = Tenant(id="acme", max_concurrency=4)
    leases = [await limits.limiter.admit(t) for _ in range(4)]
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        keys = await slot_keys(raw)
        assert keys
        await raw.delete(*keys)  # what maxmemory-policy allkeys-lru / volatile-lru does to it
        await limits.limiter.renew()  # the periodic renewal of this instance's leases
        with pytest.raises(ConcurrencyLimited):
            await limits.limiter.admit(t)
    finally:
        await raw.aclose()
    assert len(leases) == 4
