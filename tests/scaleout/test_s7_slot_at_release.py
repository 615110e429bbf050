"""Issue 16 / session 7 guard: with flow control on and Redis state, the tenant concurrency slot is
taken when the request is released, never at admission (docs/fairness.md "Concurrency slots").

The proposal "admit with ``slot=True`` when the queue would release the request at once" (one
script call fewer) cannot know at admission (before the body is read) whether the release will be
immediate; a slot taken there is held through the body read by a request not released, which
other instances see (their requests are refused a slot and wait for the 0.25 s recheck). This
pins the rule: a request admitted (its request-rate unit taken in Redis) and still reading its body
holds no slot, so the tenant's only slot (``max_concurrency: 1``) serves a request on another
instance meanwhile.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import redis.asyncio as aioredis

from tests.scaleout.test_s2_shared_admission import _eq, _redis, instances
from tests.support.waiting import wait_for

BODY = json.dumps({"model": "sim-model", "prompt": "hello there", "max_tokens": 2}).encode()


async def test_a_request_reading_its_body_holds_no_slot_across_instances(tmp_path: Path, redis_server) -> None:
    limits = {"max_concurrency": 1, "rate_rps": 1000, "rate_burst": 1000}
    async with instances(tmp_path, _redis(redis_server.url), limits, n=2) as inst:
        limiter = inst.gateways[0].limiter
        rate_key = "pgs2:{t:tenant-lim}:req"
        client = aioredis.Redis.from_url(redis_server.url)
        go = asyncio.Event()

        async def slow_body() -> AsyncIterator[bytes]:
            yield BODY[:10]
            await go.wait()
            yield BODY[10:]

        try:
            slow = asyncio.ensure_future(inst.clients[0].post(
                "/v1/completions", headers={**inst.auth(), "Content-Type": "application/json",
                                            "Content-Length": str(len(BODY))}, content=slow_body()))
            await wait_for(lambda: _exists(client, rate_key), what="the slow request admitted in Redis")
            assert await limiter.in_flight("tenant-lim") == 0  # admitted, reading its body: no slot
            other = await inst.complete(1)  # the other instance gets the tenant's only slot
            assert other.status_code == 200, other.text
            go.set()
            assert (await slow).status_code == 200
            for gw in inst.gateways:
                await gw.admission.limits.flush()
            await wait_for(lambda: _eq(limiter.in_flight("tenant-lim"), 0), what="every slot given back")
        finally:
            go.set()
            await client.aclose()


async def _exists(client: aioredis.Redis, key: str) -> bool:
    return bool(await client.exists(key))
