"""Issue 17 with shared state: a queued request holds no tenant concurrency slot in Redis either.

Unit level: the Redis limiter (through the failover wrapper the gateway uses)
admits without a slot (``slot=False``: the request unit only) and takes slots
later (``take_slots``) with the in-process limiter's semantics. Gateway level:
three instances on one redis-server, a tenant with ``max_concurrency: 4``;
requests beyond its concurrency wait in the instances' queues holding no slot
and are served when slots free; Redis never holds more than 4.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from gateway.config import StateConfig
from sim.replica import ReplicaConfig
from tenancy.limits import ConcurrencyLimited, Lease, RateLimited, TenantLimiter
from tenancy.registry import Tenant
from tenancy.shared import make_limits
from tests.scaleout.test_s2_shared_admission import _eq, _redis, instances
from tests.support.waiting import wait_for


def _cfg(url: str) -> StateConfig:
    return StateConfig(backend="redis", url=url, key_prefix="pgflow:", lease_ttl_s=2.0)


async def test_slots_taken_after_admission_behave_as_in_process(redis_server) -> None:
    lim = make_limits(_cfg(redis_server.url), failover=True)
    local = TenantLimiter()
    t = Tenant(id="acme", max_concurrency=2, rate_rps=0.001, rate_burst=3)
    try:
        shared_leases = [await lim.limiter.admit(t, slot=False) for _ in range(3)]
        local_leases = [local.admit(t, slot=False) for _ in range(3)]
        assert await lim.limiter.in_flight("acme") == 0 == local.in_flight("acme")  # no slot yet
        try:  # the request unit was taken: the burst of 3 is spent
            await lim.limiter.admit(t, slot=False)
            raise AssertionError("a fourth admission passed a burst of 3")
        except RateLimited:
            pass
        for s, loc in zip(shared_leases[:2], local_leases[:2], strict=True):
            await lim.limiter.take_slots(t, s, 1)
            local.take_slots(t, loc, 1)
        assert await lim.limiter.in_flight("acme") == 2 == local.in_flight("acme")
        for take in (lim.limiter.take_slots(t, shared_leases[2], 1),):
            try:
                await take
                raise AssertionError("a third slot beyond max_concurrency 2")
            except ConcurrencyLimited:
                pass
        try:
            local.take_slots(t, local_leases[2], 1)
            raise AssertionError("a third local slot beyond max_concurrency 2")
        except ConcurrencyLimited:
            pass
        assert lim.limiter.take_slots_now(t, shared_leases[2], 1) is None  # a Redis lease needs Redis's answer
        shared_leases[0].release()
        local_leases[0].release()
        shared_leases[2].release()  # never given a slot: its release frees nothing
        await lim.flush()
        assert await lim.limiter.in_flight("acme") == 1 == local.in_flight("acme")
    finally:
        await lim.aclose()


async def test_a_local_lease_during_an_outage_takes_its_slot_at_once() -> None:
    cfg = StateConfig(backend="redis", url="redis://127.0.0.1:9/0", key_prefix="pgflow:", on_unavailable="local",
                      instances_expected=1, command_timeout_s=0.2)
    lim = make_limits(cfg, failover=True)
    t = Tenant(id="acme", max_concurrency=1)
    try:
        a = await lim.limiter.admit(t, slot=False)  # Redis does not answer: decided locally
        b = await lim.limiter.admit(t, slot=False)
        assert isinstance(a, Lease) and isinstance(b, Lease)
        assert lim.limiter.take_slots_now(t, a, 1) is True
        assert lim.limiter.take_slots_now(t, b, 1) is False  # at its concurrency: stays queued
        a.release()
        assert lim.limiter.take_slots_now(t, b, 1) is True
    finally:
        await lim.aclose()


async def test_requests_beyond_concurrency_queue_across_instances_holding_no_slot(tmp_path: Path,
                                                                                  redis_server) -> None:
    slow = ReplicaConfig(time_scale=1.0, decode_s_per_token=0.02)  # 100 output tokens: ~2 s in flight
    async with instances(tmp_path, _redis(redis_server.url), {"max_concurrency": 4}, replica=slow) as inst:
        limiter = inst.gateways[0].limiter
        first = [asyncio.ensure_future(inst.complete(i, max_tokens=100)) for i in range(4)]
        await wait_for(lambda: _eq(limiter.in_flight("tenant-lim"), 4), what="4 slots held in Redis")
        more = [asyncio.ensure_future(inst.complete(i)) for i in range(6)]  # each instance twice
        await wait_for(lambda: sum(g.flow.tenant_queued("tenant-lim") for g in inst.gateways) >= 5,
                       what="requests beyond the concurrency queued at the instances")
        assert await limiter.in_flight("tenant-lim") == 4  # the queued ones hold no slot
        peak = 4

        async def watch() -> None:
            nonlocal peak
            while not all(f.done() for f in more):
                peak = max(peak, await limiter.in_flight("tenant-lim"))
                await asyncio.sleep(0.05)

        await watch()
        done = await asyncio.gather(*first, *more)
        assert [r.status_code for r in done] == [200] * 10, [r.text for r in done if r.status_code != 200]
        assert peak <= 4  # never more than max_concurrency released across the instances
        for gw in inst.gateways:
            await gw.admission.limits.flush()
        assert await limiter.in_flight("tenant-lim") == 0
