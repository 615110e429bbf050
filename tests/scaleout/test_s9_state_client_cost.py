"""Session 9 (issue 16): what the Redis-shared backend costs the gateway per request, same behaviour.

- :class:`tenancy.shared_conn.HeldConnection` makes its own connection, like the client pool's
  but without ``socket_timeout`` (redis-py wraps each send in ``asyncio.wait_for`` when one is set,
  a task and a timer per send on Python 3.11); the exchange's one timeout bounds connecting,
  sending and every reply, and the pool's connections are left alone.
- :class:`tenancy.shared_batch.ScriptBatcher` ``call`` / ``command`` return the reply's future
  (no coroutine per call); a call whose caller is cancelled before its batch leaves is not sent.
"""
from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis
from redis.exceptions import TimeoutError as RedisTimeoutError

from tenancy.shared_batch import BatchedScript, ScriptBatcher
from tenancy.shared_conn import HeldConnection


@pytest.fixture
async def client(redis_server):
    c = aioredis.Redis.from_url(redis_server.url, socket_timeout=0.5, socket_connect_timeout=0.5)
    yield c
    await c.aclose()


async def test_held_connection_is_its_own_without_a_send_timeout_task(client) -> None:
    h = HeldConnection(client)
    try:
        assert await h.command("PING") in (b"PONG", "PONG", True)
        tasks_before = len(asyncio.all_tasks())
        seen: list[int] = []
        orig = asyncio.get_running_loop().create_task

        def spy(coro, **kw):
            seen.append(1)
            return orig(coro, **kw)

        asyncio.get_running_loop().create_task = spy  # type: ignore[method-assign]
        try:
            for _ in range(5):
                await h.exchange(b"*1\r\n$4\r\nPING\r\n" * 3, 3)
        finally:
            asyncio.get_running_loop().create_task = orig  # type: ignore[method-assign]
        assert seen == []  # no asyncio.wait_for task per send
        assert len(asyncio.all_tasks()) == tasks_before
    finally:
        await h.aclose()


async def test_held_connection_times_out_on_a_server_that_never_answers() -> None:
    done = asyncio.Event()

    async def silent(reader, writer):
        await reader.read(1 << 20)  # takes the request, never answers
        await done.wait()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    c = aioredis.Redis.from_url(f"redis://127.0.0.1:{port}/0", socket_timeout=0.3, socket_connect_timeout=0.3)
    h = HeldConnection(c)
    try:
        t0 = time.monotonic()
        with pytest.raises(RedisTimeoutError):
            await h.exchange(b"*1\r\n$4\r\nPING\r\n", 1)
        assert time.monotonic() - t0 < 2.0
        t0 = time.monotonic()
        with pytest.raises(RedisTimeoutError):  # the retry of command() is bounded the same way
            await h.command("PING", timeout=0.2)
        assert time.monotonic() - t0 < 2.0
    finally:
        done.set()
        await h.aclose()
        await c.aclose()
        server.close()
        await server.wait_closed()


async def test_held_connection_recovers_after_a_timeout(client, redis_server) -> None:
    h = HeldConnection(client)
    try:
        with pytest.raises(RedisTimeoutError):  # BLPOP on an empty list blocks past the timeout
            await h.command("BLPOP", "pg-s9-empty", 5, timeout=0.2)
        assert await h.command("PING") in (b"PONG", "PONG", True)  # a new connection, in step
    finally:
        await h.aclose()


async def test_batched_calls_return_futures_and_a_cancelled_call_is_not_sent(client) -> None:
    b = ScriptBatcher(client)
    incr = BatchedScript(b, client.register_script("return redis.call('INCR', KEYS[1])"))
    try:
        await client.delete("pg-s9-n")
        fut = incr(keys=["pg-s9-n"])
        assert isinstance(fut, asyncio.Future)
        assert await fut == 1
        waiter = asyncio.ensure_future(incr(keys=["pg-s9-n"]))
        late = asyncio.ensure_future(incr(keys=["pg-s9-n"]))
        late.cancel()
        assert await waiter == 2
        with pytest.raises(asyncio.CancelledError):
            await late
        assert int(await client.get("pg-s9-n")) == 2  # the cancelled call never reached Redis
        assert await b.command("GET", "pg-s9-n") == b"2"
        with pytest.raises(TypeError):
            b.command("SET", "pg-s9-x", True)
    finally:
        await b.aclose()


def test_a_chain_key_that_is_not_a_string_is_a_bad_shape_not_a_reader_crash() -> None:
    """R9-S1: ``bytes.fromhex(7)`` raised ``TypeError`` out of ``apply_entry``; the reader did not
    advance past the entry and read it again after every back-off (an entry with a valid MAC only)."""
    from gateway.shared_events import decode_events
    from gateway.shared_routing import RoutingStream
    from routing.index import InProcessPrefixIndex
    from routing.load import InProcessLoadTracker
    from routing.shared import RemoteLoadView, SharedLoadTracker

    with pytest.raises(ValueError):
        decode_events(b'[["b","r0",["0102",7]]]')
    key = bytes(range(32))
    loads = SharedLoadTracker(InProcessLoadTracker(), RemoteLoadView(), lambda e: None)
    s = RoutingStream(None, "pgs9:", "a" * 16, key, InProcessPrefixIndex(10), loads, ["r0"], lease_ttl_s=10)
    other, body = "b" * 16, b'[["b","r0",[7]]]'
    st = f"1:{int(time.time() * 1000)}"  # R13-2: the writer's stamp
    mac = s._mac(other, st, body)  # noqa: SLF001 - a valid MAC, as another instance would write it
    assert s.apply_entry({b"i": other.encode(), b"n": st.encode(), b"b": body, b"m": mac.encode()}) == 0
    assert s.rejected == 1
