"""Fixtures of the scale-out tests (issue 16): a real ``redis-server`` per test.

``redis_server``: a :class:`tests.support.redis_server.RedisServer` running
on a free loopback port (skipped only when the binary is absent and ``CI`` is
unset; see :func:`tests.support.redis_server.require_redis_server`).
``limits``: the shared limiter and ledger (:func:`tenancy.shared.make_limits`)
on that server, keys under :data:`tests.support.redis_server.LIMITS_PREFIX`,
leases of 5 s; closed after the test. ``clients``: four independent Redis
clients of that server (instances and a raw writer), closed after the test.
"""
from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.config import StateConfig
from tenancy.shared import SharedLimits, make_limits
from tests.support.redis_server import LIMITS_PREFIX, RedisServer, require_redis_server


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A running ``redis-server`` with its own temp dir; stopped after the test."""
    binary = require_redis_server()
    server = RedisServer(binary, tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def limits(redis_server: RedisServer) -> AsyncIterator[SharedLimits]:
    """The shared limiter and ledger on ``redis_server`` (key prefix ``LIMITS_PREFIX``, 5 s leases)."""
    made = make_limits(StateConfig(backend="redis", url=redis_server.url, key_prefix=LIMITS_PREFIX, lease_ttl_s=5.0))
    yield made
    await made.aclose()


@pytest.fixture
async def clients(redis_server: RedisServer) -> AsyncIterator[list[aioredis.Redis]]:
    """Four Redis clients of ``redis_server`` (one per simulated instance, and one to write records raw)."""
    made = [aioredis.Redis.from_url(redis_server.url) for _ in range(4)]
    yield made
    for c in made:
        await c.aclose()
