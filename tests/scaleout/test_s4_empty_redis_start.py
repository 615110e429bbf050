"""Issue 16, "start an instance against an empty Redis: no rollback of any rotation".

Whole instances (``gateway.build``, their shared-state lifecycle) on one real ``redis-server``:
a key rotation made through one instance is persisted in every instance's state file; Redis
then restarts empty (no persistence) while every instance is down. A *new* instance started
first against the empty Redis publishes its own (older) view; an old instance started next
re-publishes the rotation from its state file, and the new one follows it forward: nobody
is rolled back, and Redis holds the rotated record again.
"""
from __future__ import annotations

from pathlib import Path

import redis.asyncio as aioredis

from tests.scaleout.s2_instances import PREFIX, instance, write_secret
from tests.support.waiting import wait_for

TENANT = "tenant-a"


async def test_instances_started_against_an_empty_redis_roll_no_rotation_back(tmp_path: Path, redis_server) -> None:
    secret = write_secret(tmp_path / "master.key")
    a, b = instance(tmp_path, 0, redis_server.url, secret), instance(tmp_path, 1, redis_server.url, secret)
    for gw in (a, b):
        await gw.shared.start()
    try:
        a.keyring.rotate_tenant(TENANT)
        a.keyring.rotate_salt(TENANT)
        assert await a.shared.keys.publish(TENANT)
        await wait_for(lambda: (b.keyring.key_version(TENANT), b.keyring.salt_epoch(TENANT)) == (2, 1),
                       what="rotation adopted by b")
        salt = a.keyring.cache_salt(TENANT)
    finally:
        for gw in (a, b):
            await gw.shared.stop()

    redis_server.stop()
    redis_server.start()  # same port, empty: every instance was down meanwhile
    raw = aioredis.Redis.from_url(redis_server.url)
    c = instance(tmp_path, 2, redis_server.url, secret)  # a new instance: its state file is fresh
    await c.shared.start()
    b2 = None
    try:
        assert c.keyring.key_version(TENANT) == 1  # nothing to adopt in the empty Redis
        b2 = instance(tmp_path, 1, redis_server.url, secret)  # b again, from its own state file
        await b2.shared.start()
        assert (b2.keyring.key_version(TENANT), b2.keyring.salt_epoch(TENANT)) == (2, 1)  # not rolled back

        async def republished() -> bool:
            rec = await raw.hget(f"{PREFIX}keys:tenants", TENANT)
            return rec is not None and rec.startswith(b"2:1:")

        await wait_for(republished, what="the rotation re-published into the empty Redis")
        await wait_for(lambda: (c.keyring.key_version(TENANT), c.keyring.salt_epoch(TENANT)) == (2, 1),
                       what="the new instance follows the rotation forward")
        assert c.keyring.cache_salt(TENANT) == b2.keyring.cache_salt(TENANT) == salt
        assert (b2.keyring.key_version(TENANT), b2.keyring.salt_epoch(TENANT)) == (2, 1)
    finally:
        await raw.aclose()
        for gw in (c, b2):
            if gw is not None:
                await gw.shared.stop()
