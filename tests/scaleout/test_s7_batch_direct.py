"""The script batcher's own pipelined send (issue 16, session 7: gateway CPU per Redis-backed request).

:class:`tenancy.shared_batch.ScriptBatcher` packs its ``EVALSHA`` calls
itself and sends them on one connection it holds, instead of building a
redis-py ``Pipeline`` per batch (``pack_command`` per call, a pool
checkout with a stale-data probe, per-reply timeout contexts). The
semantics of separate calls stay: each caller its own reply or error, a
closed connection retried once, arguments encoded as redis-py encodes them.
"""
from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from tenancy.shared_batch import BatchedScript, ScriptBatcher, pack_evalsha
from tenancy.shared_conn import _pack_py


@pytest.fixture
async def client(redis_server):
    c = aioredis.Redis.from_url(redis_server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    yield c
    await c.aclose()


def _no_pipeline(*_a, **_k):
    raise AssertionError("the batcher must not build a redis-py pipeline")


async def test_a_batch_is_sent_without_a_redis_py_pipeline_and_each_caller_gets_its_reply(client) -> None:
    client.pipeline = _no_pipeline  # type: ignore[method-assign]
    echo = BatchedScript(b := ScriptBatcher(client), client.register_script("return {KEYS[1], ARGV[1], ARGV[2]}"))
    try:
        await client.script_load(echo.script.script)
        got = await asyncio.gather(*(echo(keys=[f"k{i}"], args=[i, 0.1 * i]) for i in range(10)))
        assert got == [[f"k{i}".encode(), str(i).encode(), repr(0.1 * i).encode()] for i in range(10)]
        assert b.batches == 1 and b.calls == 10
    finally:
        await b.aclose()


async def test_a_script_error_goes_to_its_caller_only(client) -> None:
    b = ScriptBatcher(client)
    ok = BatchedScript(b, client.register_script("return 1"))
    bad = BatchedScript(b, client.register_script("return redis.error_reply('NOPE no')"))
    try:
        got = await asyncio.gather(ok(), bad(), ok(), return_exceptions=True)
        assert got[0] == 1 and got[2] == 1
        assert isinstance(got[1], ResponseError)
        assert await ok() == 1  # the connection stays in step
    finally:
        await b.aclose()


async def test_a_connection_redis_closed_is_replaced_by_one_retry(client) -> None:
    b = ScriptBatcher(client)
    one = BatchedScript(b, client.register_script("return 1"))
    try:
        assert await one() == 1
        await client.client_kill_filter(skipme=True, _type="normal")  # every other connection: ours
        assert await one() == 1
    finally:
        await b.aclose()


def test_packing_matches_redis_py_encoding() -> None:
    from redis._parsers.encoders import Encoder

    enc = Encoder("utf-8", "strict", False)
    parts = ("EVALSHA", "sha", 2, "key:é", b"raw", 7, 0.1, "", "x" * 300)
    expected = b"*9\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(enc.encode(a)), enc.encode(a)) for a in parts)
    assert pack_evalsha("sha", ["key:é", b"raw"], [7, 0.1, "", "x" * 300]) == expected
    assert _pack_py(parts) == expected  # without hiredis
    with pytest.raises(TypeError):
        pack_evalsha("sha", [], [True])
    with pytest.raises(TypeError):
        _pack_py(("EVALSHA", "sha", 0, True))
