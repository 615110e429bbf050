"""Session 18, helper store: R17-4. A RENEW whose reply is lost or malformed after the script ran
(it re-adds the member of a lease released during the round trip) still re-queues that lease's
release, and the other tenants of the renewal are still renewed (tenancy/shared_limiter.py)."""
from __future__ import annotations

from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError

from tenancy.registry import Tenant
from tenancy.shared_limiter import RedisTenantLimiter
from tenancy.shared_store import Store


@pytest.fixture
async def store(redis_server):
    st = Store(aioredis.Redis.from_url(redis_server.url), "pgr4:", 5.0)
    yield st
    await st.writer.aclose()
    await st.batcher.aclose()
    await st.client.aclose()


@pytest.mark.parametrize("reply", ["lost", "malformed"])
async def test_a_lost_renew_reply_still_frees_a_lease_released_meanwhile(store: Store, reply: str) -> None:
    limiter = RedisTenantLimiter(store)
    a, b = Tenant(id="acme", max_concurrency=2), Tenant(id="beta", max_concurrency=2)
    a1 = await limiter.admit(a)
    await limiter.admit(b)
    real = store.renew
    renewed: list[str] = []

    async def racing(*, keys: list[str], args: list[Any]) -> Any:
        renewed.append(keys[0])
        if keys[0] != store.key("acme", "conc"):
            return await real(keys=keys, args=args)
        a1.release()  # the request ends while its RENEW is in flight; its ZREM runs first
        await store.writer.flush()
        await real(keys=keys, args=args)  # the script ran (and re-added the member) ...
        if reply == "lost":  # ... but its reply never arrives
            raise RedisConnectionError("connection reset after the script ran")
        return [b"not a count"]

    store.renew = racing  # type: ignore[method-assign]
    with pytest.raises(RedisError):
        await limiter.renew()
    store.renew = real  # type: ignore[method-assign]
    await store.writer.flush()
    assert await limiter.in_flight("acme") == 0, "the re-added slot of a released lease stays until its TTL"
    assert store.key("beta", "conc") in renewed, "the other tenant was not renewed"
    assert await limiter.in_flight("beta") == 1
    # the limiter keeps working: acme has both slots back, the next renewal succeeds
    await limiter.admit(a)
    await limiter.admit(a)
    assert await limiter.renew() == 3
