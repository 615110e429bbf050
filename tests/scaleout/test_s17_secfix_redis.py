"""Session 17, helper secfix: S17-9 (evicted slot sets rebuilt by the renewal; the eviction-policy check at
start) and S17-8 (a malformed reply to the ledger's scripts is Redis unavailable, never a tenant's verdict)."""
from __future__ import annotations

import logging

import pytest
import redis.asyncio as aioredis

from tenancy.limits import ConcurrencyLimited
from tenancy.registry import Tenant
from tenancy.shared_failover import unavailable_errors
from tenancy.shared_ledger import RedisLedger
from tenancy.shared_lua import int_reply, wait_reply
from tests.support.redis_server import slot_keys


async def test_a_rebuilt_slot_set_is_released_in_full(limits, redis_server) -> None:
    """After a renewal rebuilt an evicted set, releasing the leases frees every slot (none leaks)."""
    t = Tenant(id="acme", max_concurrency=3)
    leases = [await limits.limiter.admit(t) for _ in range(3)]
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        await raw.delete(*await slot_keys(raw))
        lost = limits.limiter.lost_slots
        assert await limits.limiter.renew() == 0
        assert limits.limiter.lost_slots == lost + 3
        assert await limits.limiter.in_flight("acme") == 3
        for lease in leases:
            lease.release()
        await limits.flush()
        assert await limits.limiter.in_flight("acme") == 0
        again = [await limits.limiter.admit(t) for _ in range(3)]
        with pytest.raises(ConcurrencyLimited):
            await limits.limiter.admit(t)
        assert len(again) == 3
    finally:
        await raw.aclose()


async def test_the_eviction_policy_is_checked(limits, redis_server, caplog: pytest.LogCaptureFixture) -> None:
    assert await limits.limiter.check_eviction_policy() == "noeviction"
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        await raw.config_set("maxmemory-policy", "allkeys-lru")
        with caplog.at_level(logging.WARNING, logger="prefixgate.state"):
            assert await limits.limiter.check_eviction_policy() == "allkeys-lru"
        assert any("not noeviction" in r.getMessage() for r in caplog.records)
    finally:
        await raw.aclose()


@pytest.mark.parametrize("reply", [b"OK", None, 3, [b"ok"], [b"rate", b"nan"], [b"rate", b"-1"],
                                   [b"rate", b"1e999"], [b"concurrency", b"1", b"2", b"3", b"4"],
                                   [b"ok", b"0", b"x", b"1", b"1"], [b"ok", 0], [b"\xff", b"0"]])
def test_malformed_verdicts_are_redis_unavailable(reply) -> None:
    with pytest.raises(unavailable_errors()):
        wait_reply(reply)


def test_verdicts_are_read() -> None:
    assert wait_reply([b"rate", b"inf"]) == ("rate", float("inf"))
    assert wait_reply(["tenant_prompt_tokens", "0.25"]) == ("tenant_prompt_tokens", 0.25)
    assert wait_reply([b"ok", b"0", b"3.5", b"1", b"10"]) == ("ok", 0.0)
    assert int_reply(2, 0, 3) == 2
    for bad in (b"OK", True, -1, 4):
        with pytest.raises(unavailable_errors()):
            int_reply(bad, 0, 3)


class _GarbageStore:
    """A stand-in :class:`tenancy.shared_store.Store` whose scripts answer ``+OK`` (a wrong service)."""

    prefix = "pgsf:"

    def key(self, tenant_id: str, what: str) -> str:
        return f"{self.prefix}{tenant_id}:{what}"

    async def reserve(self, **kwargs):
        return b"OK"

    async def level(self, **kwargs):
        return b"PONG"


async def test_a_ledger_reply_of_the_wrong_shape_is_redis_unavailable() -> None:
    ledger = RedisLedger(_GarbageStore())  # type: ignore[arg-type]
    with pytest.raises(unavailable_errors()):
        await ledger.reserve(Tenant(id="acme", prompt_tokens_per_s=10.0), 1, 1)
    with pytest.raises(unavailable_errors()):
        await ledger.level("acme", "prompt")
