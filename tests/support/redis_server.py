"""A real ``redis-server`` on loopback for the shared-state tests (issue 16).

:class:`RedisServer` (from :mod:`sim.redis_server`, shared with
``bench.scaleout``) runs one on a free loopback port with its own temporary
directory and no persistence, waits until ``PING`` answers and stops it.

:func:`require_redis_server` decides whether the tests may skip, by the rule of
:func:`tests.support.system_deps.require_system_binary` (the syslog tests' too):
only when the binary is absent *and* the ``CI`` environment variable is unset.
Under CI a missing binary is a failure, so a CI job cannot silently skip the
shared-state tests.
"""
from __future__ import annotations

from sim.redis_server import REDIS_SERVER, RedisServer
from tests.support.system_deps import require_system_binary

__all__ = ["LIMITS_PREFIX", "REDIS_SERVER", "RedisServer", "require_redis_server", "slot_keys"]

LIMITS_PREFIX = "pgtest:"
"""Key prefix of the scale-out tests' ``limits`` fixture (tests/scaleout/conftest.py)."""


async def slot_keys(raw, prefix: str = LIMITS_PREFIX) -> list[bytes]:
    """The slot sets (Redis sorted sets) under ``prefix`` on the client ``raw`` (``redis.asyncio.Redis``)."""
    return [k async for k in raw.scan_iter(f"{prefix}*") if await raw.type(k) == b"zset"]


def require_redis_server() -> str:
    """Return the ``redis-server`` path; skip the test when it is absent, or
    fail when it is absent and ``CI`` is set (CI must not skip silently;
    :func:`tests.support.system_deps.require_system_binary`, shared with the syslog tests)."""
    return require_system_binary(REDIS_SERVER, "redis-server is not installed (run `make system-deps`, Debian "
                                 "package redis-server)", "the shared-state tests")
