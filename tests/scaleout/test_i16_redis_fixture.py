"""The ``redis_server`` fixture: a real server answers, restarts empty on the same port, and the
skip rule fails under CI instead of skipping."""
from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from tests.support import redis_server as rs


async def test_redis_server_answers_and_restarts_empty(redis_server):
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        assert await client.ping()
        await client.set("pg:probe", "1")
        assert await client.get("pg:probe") == b"1"
    finally:
        await client.aclose()
    port = redis_server.port
    redis_server.stop()
    redis_server.start()
    assert redis_server.port == port
    client = aioredis.Redis.from_url(redis_server.url)
    try:
        assert await client.get("pg:probe") is None  # --save '' --appendonly no: nothing survives
    finally:
        await client.aclose()


def test_missing_binary_fails_under_ci(monkeypatch):
    monkeypatch.setattr(rs, "REDIS_SERVER", None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        rs.require_redis_server()
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="not installed"):
        rs.require_redis_server()
