"""Script calls to Redis made in one event-loop tick sent as one pipeline (issue 16, round trips).

Every admitted request makes up to three Redis script calls on its path
(admit, reserve, the flow-control slot) and each used to be its own round
trip: one ``send`` and one ``recv`` system call in the gateway, one read
and one write in ``redis-server``. Under load many requests are between two
of those steps in the same loop tick. :class:`ScriptBatcher` queues the
calls and sends what was queued as one non-transactional pipeline of
``EVALSHA`` commands (redis-py's public ``pipeline`` / ``evalsha``): one
write, one read, one reply parse per batch. While a batch is in flight the
next calls queue up and leave together when it is answered, so the batch
size follows the load and an idle gateway adds no wait (a lone call leaves
on the next loop iteration).

Semantics are those of separate calls: each script is atomic on its own,
calls leave in the order they were made, each caller gets its own reply or
error (a script error to its caller only; a connection error or timeout to
every caller of the batch, as each would have had it, and to the calls
queued behind it, which would have met the same Redis). A call whose caller
was cancelled before the batch left is not sent. A script Redis does not
hold (``NOSCRIPT``: a restarted, emptied Redis) is loaded and the calls
that needed it are sent again; no ``SCRIPT EXISTS`` round trip per batch.

The batch is packed here (:func:`pack_evalsha`, the bytes redis-py's encoder
would produce) and sent on one connection the batcher holds, made like the
client pool's (:class:`tenancy.shared_conn.HeldConnection`; at most one
batch is in flight, so one suffices); one timeout (the client's
``socket_timeout``) bounds the sending and the reading of a batch's replies.
Session 7: a redis-py ``Pipeline`` per batch cost a pool checkout with a
stale-data probe, ``pack_command`` per call, a timeout context per reply
and its observability hooks, about half of the gateway's extra CPU per
Redis-backed request. A connection that fails (closed by a Redis restart,
timed out) is closed and the batch sent once more on a new one, as the
client's ``Retry(NoBackoff(), 1)`` did for the pipeline; the second failure
goes to the callers.
Session 8: :meth:`ScriptBatcher.command` queues any non-blocking command
beside the scripts (the routing stream's ``XADD`` and busy ``XREAD``,
gateway/shared_routing.py), so under load those make no round trip of
their own either.
Session 9: :meth:`ScriptBatcher.call` and :meth:`ScriptBatcher.command` are
plain functions returning the reply's future (the caller awaits it): no
coroutine frames per call between the caller and the future.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from tenancy.shared_conn import HeldConnection, pack

__all__ = ["BatchedScript", "ScriptBatcher", "pack_evalsha"]


def pack_evalsha(sha: str, keys: Sequence[Any], args: Sequence[Any]) -> bytes:
    """The RESP request ``EVALSHA sha len(keys) *keys *args`` (:func:`tenancy.shared_conn.pack`:
    bytes as is, str as UTF-8, int and float by ``repr``). Raises :class:`TypeError` for any other
    type (bool included)."""
    return pack(("EVALSHA", sha, len(keys), *keys, *args))


class _Call:
    __slots__ = ("script", "keys", "args", "future")

    def __init__(self, script: Any, keys: Sequence[Any], args: Sequence[Any], future: asyncio.Future[Any]) -> None:
        self.script = script  # None: ``args`` is one packed command (ScriptBatcher.command)
        self.keys = keys
        self.args = args
        self.future = future

    def packed(self) -> bytes:
        return self.args if self.script is None else pack_evalsha(self.script.sha, self.keys, self.args)


class ScriptBatcher:
    """Queues ``EVALSHA`` calls of registered scripts and sends them in pipelined batches.

    ``client``: a :class:`redis.asyncio.Redis`; ``max_batch``: the most calls
    in one pipeline (more wait for the next). Counters: ``batches`` sent,
    ``calls`` sent (``calls / batches`` is the mean batch size).
    """

    def __init__(self, client: Any, max_batch: int = 256) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.client = client
        self.max_batch = max_batch
        self.batches = 0
        self.calls = 0
        self._pending: list[_Call] = []
        self._scheduled = False
        self._in_flight = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._conn = HeldConnection(client)  # at most one batch is in flight: one connection suffices

    def call(self, script: Any, keys: Sequence[Any], args: Sequence[Any]) -> asyncio.Future[Any]:
        """Queue ``script`` (a :class:`redis.commands.core.AsyncScript` of ``client``) with ``keys`` and
        ``args`` for the next batch; returns the future of its reply (await it). Its error is what
        Redis or the connection raised (:class:`redis.exceptions.RedisError`, ``OSError``,
        ``asyncio.TimeoutError``). Session 9: a plain function returning the future, not a
        coroutine (one coroutine layer less per call; cancelling the awaiting task cancels the
        future, and a cancelled call is not sent, as before)."""
        return self._queue(_Call(script, keys, args, asyncio.get_running_loop().create_future()))

    def command(self, *args: Any) -> asyncio.Future[Any]:
        """Queue one command that never blocks the server (e.g. ``XADD``, ``XREAD`` without ``BLOCK``)
        for the next batch, beside the script calls (session 8: the routing stream rides the request
        path's round trips instead of making its own); returns the future of its reply, raw as
        :meth:`tenancy.shared_conn.HeldConnection.command` gives it. Errors as :meth:`call`; a bad
        argument type raises :class:`TypeError` here. A blocking command would hold every call
        batched with it: never send one here."""
        packed = pack(args)
        return self._queue(_Call(None, (), packed, asyncio.get_running_loop().create_future()))  # type: ignore[arg-type]

    def _queue(self, call: _Call) -> asyncio.Future[Any]:
        self._pending.append(call)
        if not self._scheduled and not self._in_flight:
            self._scheduled = True
            call.future.get_loop().call_soon(self._flush)
        return call.future

    def _flush(self) -> None:
        self._scheduled = False
        batch, self._pending = self._pending[:self.max_batch], self._pending[self.max_batch:]
        batch = [c for c in batch if not c.future.done()]  # its caller gave up before it left
        if not batch:
            if self._pending:
                self._flush()
            return
        self._in_flight = True
        task = asyncio.get_running_loop().create_task(self._send(batch), name="prefixgate-state-batch")
        self._tasks.add(task)
        task.add_done_callback(self._sent)

    def _sent(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._in_flight = False
        if self._pending and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    async def _execute(self, batch: list[_Call]) -> list[Any]:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        packed = b"".join(c.packed() for c in batch)
        self.batches += 1
        self.calls += len(batch)
        try:
            return await self._conn.exchange(packed, len(batch))
        except (RedisConnectionError, RedisTimeoutError):  # one retry on a new connection, as Retry(..., 1)
            return await self._conn.exchange(packed, len(batch))

    async def _send(self, batch: list[_Call]) -> None:
        from redis.exceptions import NoScriptError

        try:
            results = await self._execute(batch)
            missing = [i for i, r in enumerate(results) if isinstance(r, NoScriptError) and batch[i].script is not None]
            if missing:  # an emptied Redis: load what is missing, send those calls again
                for script in {id(batch[i].script): batch[i].script for i in missing}.values():
                    await self.client.script_load(script.script)
                again = await self._execute([batch[i] for i in missing])
                for i, r in zip(missing, again, strict=True):
                    results[i] = r
        except asyncio.CancelledError:
            for c in batch:
                c.future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - the connection failed: every caller gets it
            # and so do the calls queued behind it (sent next, each would wait for the same dead or
            # hung Redis, up to its own timeout)
            behind, self._pending = self._pending, []
            for c in (*batch, *behind):
                if not c.future.done():
                    c.future.set_exception(exc)
            return
        for c, r in zip(batch, results, strict=True):
            if c.future.done():
                continue
            if isinstance(r, BaseException):
                c.future.set_exception(r)
            else:
                c.future.set_result(r)

    async def aclose(self) -> None:
        """Cancel batches in flight (their callers get ``CancelledError``) and drop queued calls."""
        for c in self._pending:
            c.future.cancel()
        self._pending.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._conn.aclose()


class BatchedScript:
    """A registered script whose calls go through a :class:`ScriptBatcher`:
    ``await s(keys=[...], args=[...])`` as redis-py's ``AsyncScript``; ``script`` is that one."""

    __slots__ = ("batcher", "script")

    def __init__(self, batcher: ScriptBatcher, script: Any) -> None:
        self.batcher = batcher
        self.script = script

    def __call__(self, keys: Sequence[Any] = (), args: Sequence[Any] = ()) -> asyncio.Future[Any]:
        """The future of the script's reply (see :meth:`ScriptBatcher.call`; await it)."""
        return self.batcher.call(self.script, keys, args)
