"""One Redis connection held for a single user at a time, with the command packed here (issue 16,
session 7: gateway CPU per Redis-backed request).

redis-py's ``execute_command`` and ``Pipeline`` pay, per call, a pool
checkout with a stale-data probe, ``pack_command``, a timeout context per
reply, response callbacks and observability hooks: 60-150 µs of CPU per
round trip on the gateway's hot paths (the script batches of
:mod:`tenancy.shared_batch`, the routing stream's ``XADD`` / ``XREAD``).
:class:`HeldConnection` takes one connection from the client's pool on first
use and keeps it; a request is packed by :func:`pack` (hiredis's
``pack_command`` when installed, else the same bytes in Python) and sent
through the connection's public ``send_packed_command`` and
``read_response``. One timeout (the client's ``socket_timeout``, or the
caller's) bounds reading all replies of one exchange. A failure other than
an error reply closes the connection (the next exchange connects anew), and
:meth:`HeldConnection.command` sends once more on a new connection after a
connection error or timeout, as the client's ``Retry(NoBackoff(), 1)`` did.
Exchanges are serialized by a lock, so concurrent callers never interleave
on the socket.

Session 9: the connection is the holder's own, made like the pool's (the
client pool's public ``connection_class`` and ``connection_kwargs``) but
without a ``socket_timeout``: with one, redis-py's ``send_packed_command``
wraps each send in ``asyncio.wait_for``, which on Python 3.11 runs the
send as a task of its own with a timer (about 10 µs of CPU per exchange,
a third of a small batch's). The exchange's own timeout now bounds
everything, connecting and sending included; the connect timeout stays the
client's (``socket_connect_timeout``, else ``socket_timeout``). A connection
error or timeout disconnects it; the next exchange connects it again.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

__all__ = ["HeldConnection", "pack"]


def _enc(x: Any) -> bytes:
    # redis-py's Encoder.encode (utf-8, strict): bytes as they are, int/float by repr, str in UTF-8
    if isinstance(x, bytes):
        return x
    if isinstance(x, str):
        return x.encode()
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return repr(x).encode()
    raise TypeError(f"invalid command argument type {type(x).__name__}: bytes, str, int or float")


def _pack_py(args: Sequence[Any]) -> bytes:
    parts = [_enc(a) for a in args]
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


try:  # the C packer of hiredis (a dependency: redis[hiredis]): the same bytes, a third of the CPU
    from hiredis import pack_command as _hiredis_pack
except ImportError:  # pragma: no cover - hiredis absent: the Python packer
    _hiredis_pack = None


def pack(args: Sequence[Any]) -> bytes:
    """The RESP request of one command ``args`` (bytes), each argument encoded as redis-py encodes
    it (bytes as is, str as UTF-8, int and float by ``repr``). Raises :class:`TypeError` for any
    other type (bool included)."""
    if _hiredis_pack is not None:
        for x in args:
            if x.__class__ is bool:
                raise TypeError("invalid command argument type bool")
        return _hiredis_pack(tuple(args))
    return _pack_py(args)


def _own_connection(pool: Any) -> Any:
    """A new, unconnected connection made as ``pool`` makes its own, without a ``socket_timeout``
    (the caller bounds each exchange; module doc); the connect timeout as the pool's."""
    kw = dict(pool.connection_kwargs)
    connect_timeout = kw.get("socket_connect_timeout") or kw.get("socket_timeout")
    kw["socket_timeout"] = None
    kw["socket_connect_timeout"] = connect_timeout
    if "orig_socket_timeout" in kw:  # what a maintenance-notification reset would restore: none either
        kw["orig_socket_timeout"] = None
    return pool.connection_class(**kw)


class HeldConnection:
    """A connection to ``client``'s server (``client``: a :class:`redis.asyncio.Redis`), made like the
    client pool's and kept for one user at a time (module doc)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self._conn: Any = None
        self._lock = asyncio.Lock()

    async def exchange(self, packed: bytes, n: int, timeout: float | None = None) -> list[Any]:
        """Send ``packed`` (``n`` commands) and read ``n`` replies: each a reply or the
        :class:`redis.exceptions.ResponseError` Redis answered. ``timeout``: seconds for all
        replies (default the client's ``socket_timeout``). Any other failure closes the connection
        and is raised as redis-py raises it (a timeout as :class:`redis.exceptions.TimeoutError`,
        a lost connection as :class:`redis.exceptions.ConnectionError`)."""
        from redis.exceptions import ResponseError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        async with self._lock:
            pool = self.client.connection_pool
            if self._conn is None:
                self._conn = _own_connection(pool)
            conn = self._conn
            if timeout is None:
                timeout = pool.connection_kwargs.get("socket_timeout")
            done = False
            try:
                out: list[Any] = []
                async with asyncio.timeout(timeout):  # connecting, sending and every reply
                    await conn.send_packed_command(packed, check_health=False)
                    for _ in range(n):
                        try:  # timeout=inf: no per-reply timer, the one above bounds them all
                            out.append(await conn.read_response(timeout=math.inf))
                        except ResponseError as exc:  # that command's; the stream stays in step
                            out.append(exc)
                done = True
                return out
            except TimeoutError:
                raise RedisTimeoutError("Timeout reading from Redis") from None
            finally:
                if not done:
                    await conn.disconnect(nowait=True)

    async def command(self, *args: Any, timeout: float | None = None) -> Any:
        """Run one command; its reply (raw: bytes, ints, nested lists, None). Raises the
        :class:`redis.exceptions.ResponseError` Redis answered, or what :meth:`exchange` raises
        after one retry on a new connection."""
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import TimeoutError as RedisTimeoutError

        packed = pack(args)
        try:
            (reply,) = await self.exchange(packed, 1, timeout)
        except (RedisConnectionError, RedisTimeoutError):
            (reply,) = await self.exchange(packed, 1, timeout)
        if isinstance(reply, Exception):
            raise reply
        return reply

    async def aclose(self) -> None:
        """Close the connection (a later exchange makes one again)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.disconnect()
