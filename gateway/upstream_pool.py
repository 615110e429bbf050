"""The gateway's pool of keep-alive connections to the replicas (issue 14).

:class:`UpstreamPool` replaces aiohttp's ``ClientSession`` on the request
path (gateway/proxy.py); health checks and the engine-metrics poller keep a
small aiohttp session (gateway/upstream.py). Connections are
:class:`gateway.upstream_conn.UpstreamConnection`; framing and reuse rules
are there.

- At most ``limit`` connections open at once, idle ones included; a request
  that finds none free waits for one (bounded by its ``deadline``, or by the
  caller's ``asyncio.timeout`` around the call), and an idle connection to
  another replica is closed to make room before waiting.
- A request's ``deadline`` (session 8) also bounds the answer's waits until
  the caller clears it at the first byte: one timer per pool for all of them
  (:mod:`gateway.upstream_deadline`), not an ``asyncio.timeout`` per call.
- The request head is a per-(method, URL) template (request line, ``Host``,
  default headers) plus the request's own headers and ``Content-Length``
  (:mod:`gateway.upstream_head`).
- :meth:`UpstreamPool.send_idle` writes a request on an idle connection at once, with no
  coroutine and no await (session 16: the usual request of a warm gateway); :meth:`UpstreamPool.request`
  is the general path (it waits for a connection or opens one) and waits for the answer's head.
- An idle connection is reused only when nothing waits unread in its socket
  (:meth:`gateway.upstream_conn.UpstreamConnection.quiet`; else it is closed:
  late bytes would be read as the new request's answer, R6b-2). The request's
  ``X-Request-Id`` (if any) must match the answer's echo, if any.
- Idle connections are reused newest first and closed after
  :data:`IDLE_KEEPALIVE_S` seconds (one timer per pool sweeps them) (below uvicorn's default 5 s keep-alive,
  which vLLM and SGLang servers use, so the gateway seldom picks a
  connection the replica is closing). A reused connection the replica closed
  before sending any byte of the answer is retried once on a new connection;
  nothing else is retried here (the pipeline retries on other replicas).
- A request that could not be written at once (it waited for a free connection, or for a new one to
  open) is written only while its caller's ``guard`` still holds: ``guard.generation`` equal to the
  generation the caller gave (session 19, S19-RC6: the pipeline's authorization decision must hold at
  the moment its request is written); else the connection goes back to the pool unused and
  :class:`NotWritten` is raised. A request written at once (:meth:`UpstreamPool.send_idle`) never reads it.
- Connecting is bounded by ``connect_timeout_s`` (``TimeoutError``); a
  refused or unreachable address raises :class:`UpstreamConnectError`.
- Every request carries ``default_headers`` (``Accept-Encoding: identity``),
  a ``Host`` and a ``Content-Length``; header names or values containing CR
  or LF are refused (ValueError). Methods: POST and GET only (no HEAD: its
  answer has no body, which the parser would have to be told).
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Mapping
from functools import partial
from typing import Protocol

from audit.tls import client_context
from gateway.upstream_conn import UpstreamConnection, UpstreamConnectionLost, UpstreamResponse
from gateway.upstream_deadline import DeadlineWatch
from gateway.upstream_head import Origin, RequestHeads

__all__ = ["UpstreamPool", "UpstreamConnectError", "NotWritten", "Versioned", "IDLE_KEEPALIVE_S"]

#: seconds an idle connection may be reused
IDLE_KEEPALIVE_S = 4.0
_NO_HEADERS: Mapping[str, str] = {}


class UpstreamConnectError(Exception):
    """No connection could be made (refused, unreachable, name not resolved): the request never left."""


class NotWritten(Exception):
    """A request that waited for a connection was not written: its caller's ``guard`` moved meanwhile
    (:meth:`UpstreamPool.request`). No byte left; the connection went back to the pool unused (idle,
    a waiting request woken), so nothing is owed for it: no failure, no answer to read or close."""


class Versioned(Protocol):
    """What a deferred write is guarded by (:meth:`UpstreamPool.request`): an ``int`` ``generation``
    that moves with every change the caller's request must see before it is written (the pipeline's
    :class:`gateway.pep.DecisionPoint`)."""

    generation: int


class UpstreamPool:
    """Pooled HTTP/1.1 client. ``limit``: most open connections; ``connect_timeout_s``: seconds;
    ``default_headers``: sent on every request (the caller's headers override them by name).

    Use inside one running event loop; :meth:`close` ends every connection.
    """

    def __init__(self, limit: int, connect_timeout_s: float, *, default_headers: Mapping[str, str] | None = None,
                 keepalive_s: float = IDLE_KEEPALIVE_S, ssl_context: ssl.SSLContext | None = None) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        self.closed = False
        self._heads = RequestHeads(default_headers)
        self._ssl = ssl_context
        self._idle: dict[tuple[str, str, int], deque[UpstreamConnection]] = {}
        self._open = 0
        self._conns: set[UpstreamConnection] = set()
        self._waiters: deque[asyncio.Future[None]] = deque()
        self._sweep_timer: asyncio.TimerHandle | None = None
        self._deadlines = DeadlineWatch()
        # the loop of the open connections (None while none is open): on CPython 3.11 every
        # asyncio.get_running_loop() is a getpid system call; a warm request makes none (session 10)
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def open_connections(self) -> int:
        """Connections open or being opened (busy and idle)."""
        return self._open

    @property
    def idle_connections(self) -> int:
        """Connections open and waiting for a request."""
        return sum(len(q) for q in self._idle.values())

    @property
    def waiting(self) -> int:
        """Requests waiting for a connection to be freed (the pool at its ``limit``, none idle to close)."""
        return len(self._waiters)

    @property
    def deadlines_pending(self) -> int:
        """Calls whose deadline is still watched (0 once every call got its first byte or ended)."""
        return self._deadlines.pending

    def time(self) -> float:
        """The event loop's clock (seconds; the time base of ``deadline``): the loop of the pool's open
        connections, else the running loop's. Call from within the running loop."""
        return (self._loop or asyncio.get_running_loop()).time()

    def head(self, method: str, url: str, headers: Mapping[str, str], body_len: int) -> bytes:
        """The request head (bytes) of ``method`` ``url`` with ``headers`` and a body of ``body_len`` bytes
        (:meth:`gateway.upstream_head.RequestHeads.head`). Raises ValueError for another method than
        POST/GET, a bad URL or CR/LF in a header."""
        return self._heads.head(method, url, headers, body_len)

    def send_idle(self, method: str, url: str, body: bytes = b"", headers: Mapping[str, str] | None = None, *,
                  deadline: float | None = None) -> UpstreamResponse | None:
        """Write one request at once on an idle connection to ``url``'s origin (newest first, as
        :meth:`request` takes it: live, within the keep-alive, nothing unread in its socket), with no
        coroutine and no await (session 16); None when there is none (then call :meth:`request`).

        Returns the :class:`UpstreamResponse` of the written request: await its ``wait_head()``, read
        its body, close it. ``deadline`` as in :meth:`request` (the answer's waits only: no connection
        is waited for). The connection carried an answer before: when ``wait_head()`` raises
        :class:`gateway.upstream_conn.UpstreamConnectionLost` with ``received_any`` False, the replica
        closed it as it was reused; :meth:`request` with ``fresh=True`` sends once more (what
        :meth:`request` itself does). Raises ValueError (bad URL, method or header; no connection is
        taken then), nothing else.
        """
        loop = self._loop
        if loop is None:  # no connection open: none idle (and no loop lookup)
            return None
        heads = self._heads
        target = heads.target(method, url)
        if not self._idle.get(target.origin.key):
            return None
        headers = headers or _NO_HEADERS
        data = heads.head_on(target, method, url, headers, len(body)) + body  # a refused head takes nothing
        conn = self._take_idle(target.origin, loop)
        if conn is None:
            return None
        resp = conn.send(data, headers.get("X-Request-Id") or headers.get("x-request-id"))
        if deadline is not None:  # after the write: the replica works meanwhile
            resp.watch_deadline(self._deadlines, deadline, loop)
        return resp

    def _send(self, conn: UpstreamConnection, data: bytes, headers: Mapping[str, str], deadline: float | None,
              loop: asyncio.AbstractEventLoop) -> UpstreamResponse:
        """Write ``data`` (head and body) on ``conn``; its answer's waits bounded by ``deadline``."""
        resp = conn.send(data, headers.get("X-Request-Id") or headers.get("x-request-id"))
        if deadline is not None:
            resp.watch_deadline(self._deadlines, deadline, loop)
        return resp

    async def request(self, method: str, url: str, body: bytes = b"",
                      headers: Mapping[str, str] | None = None, *, deadline: float | None = None,
                      fresh: bool = False, guard: Versioned | None = None, generation: int = 0) -> UpstreamResponse:
        """Send one request and wait for the answer's status and headers.

        Returns the :class:`UpstreamResponse` (read its body, then close it).
        ``deadline`` (loop time, seconds; None: none): the wait for a connection and the answer's
        waits raise ``TimeoutError`` once it passes, until the caller calls the response's
        ``clear_deadline()`` (one timer per pool: :mod:`gateway.upstream_deadline`). ``fresh``: on a
        new connection only (a retry after a kept-alive one was closed under the request:
        :meth:`send_idle`). ``guard``: a request that had to wait for a connection (a freed one or a new
        one) is written only when ``guard.generation == generation`` then (no await in between); else the
        connection goes back unused and :class:`NotWritten` is raised (session 19, S19-RC6: read only
        after such a wait, never on a connection taken at once).
        Raises :class:`NotWritten`, :class:`UpstreamConnectError` (no connection), ``TimeoutError``
        (connect timeout, deadline), :class:`gateway.upstream_conn.UpstreamConnectionLost`,
        :class:`gateway.upstream_conn.UpstreamProtocolError`, ValueError (bad
        URL, method or header), RuntimeError (pool closed). Cancelling it
        aborts the connection in use.
        """
        headers = headers or _NO_HEADERS
        target = self._heads.target(method, url)
        data = self._heads.head_on(target, method, url, headers, len(body)) + body
        origin = target.origin
        loop = self._loop or asyncio.get_running_loop()
        while True:
            conn = None if fresh else self._take_idle(origin, loop)
            if conn is None:
                if deadline is None:
                    conn = await self._acquire(origin, fresh)
                else:
                    async with asyncio.timeout_at(deadline):
                        conn = await self._acquire(origin, fresh)
                if guard is not None and guard.generation != generation:  # changed while it waited: S19-RC6
                    self._idled(conn, origin)  # unused: idle again (a waiting request is woken), none owed
                    raise NotWritten("the request's guard moved while it waited for a connection")
            resp = self._send(conn, data, headers, deadline, loop)
            try:
                await resp.wait_head()
            except UpstreamConnectionLost as exc:
                resp.close()
                if conn.reused and not exc.received_any and not fresh:
                    fresh = True  # the replica closed a kept-alive connection as we used it: once more
                    continue
                raise
            except BaseException:
                resp.close()
                raise
            return resp

    async def close(self) -> None:
        """Close every connection; later requests raise RuntimeError."""
        self.closed = True
        self._loop = None
        self._deadlines.close()
        if self._sweep_timer is not None:
            self._sweep_timer.cancel()
            self._sweep_timer = None
        for conn in list(self._conns):
            conn.abort()
        self._idle.clear()
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)

    # ----------------------------------------------------------------- internals
    def _take_idle(self, origin: Origin, loop: asyncio.AbstractEventLoop) -> UpstreamConnection | None:
        """The newest live, quiet idle connection to ``origin`` (stale, closing or noisy ones are closed), or None."""
        idle = self._idle.get(origin.key)
        if not idle:
            return None
        oldest_ok = loop.time() - self.keepalive_s
        while idle and (idle[0].idle_since < oldest_ok or idle[0].closed):  # stale or closed: the oldest first
            idle.popleft().abort()
        while idle:
            conn = idle.pop()
            if conn.usable() and conn.quiet():  # open, not closing, nothing unread (R6b-2)
                return conn
            conn.abort()
        return None

    async def _acquire(self, origin: Origin, fresh: bool) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        while True:
            if self.closed:
                raise RuntimeError("the upstream pool is closed")
            if not fresh and (conn := self._take_idle(origin, loop)) is not None:
                return conn
            if self._open < self.limit or self._evict_idle():
                return await self._connect(origin)
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # woken but leaving: pass the turn on
                raise
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _evict_idle(self) -> bool:
        """Close the oldest live idle connection (any replica) to make room; False when there is none."""
        while True:
            oldest: deque[UpstreamConnection] | None = None
            for q in self._idle.values():
                if q and (oldest is None or q[0].idle_since < oldest[0].idle_since):
                    oldest = q
            if oldest is None:
                return False
            conn = oldest.popleft()
            if not conn.closed:
                conn.abort()
                return self._open < self.limit

    async def _connect(self, origin: Origin) -> UpstreamConnection:
        loop = asyncio.get_running_loop()
        self._open += 1
        try:
            ctx = None
            if origin.tls:
                ctx = self._ssl = self._ssl or client_context()  # S19-R3: floor and suites of audit/tls.py
            async with asyncio.timeout(self.connect_timeout_s):
                _, conn = await loop.create_connection(
                    lambda: UpstreamConnection(partial(self._idled, origin=origin), self._closed, loop),
                    origin.host, origin.port, ssl=ctx, server_hostname=origin.host if ctx else None)
        except OSError as exc:
            self._release_slot()
            raise UpstreamConnectError(exc.strerror or type(exc).__name__) from None
        except BaseException:
            self._release_slot()
            raise
        conn.counted = True
        self._conns.add(conn)
        self._loop = loop
        if self.closed:
            conn.abort()
            raise RuntimeError("the upstream pool is closed")
        return conn

    def _idled(self, conn: UpstreamConnection, origin: Origin) -> None:
        if self.closed:
            conn.abort()
            return
        loop = conn.loop or asyncio.get_running_loop()
        conn.idle_since = loop.time()
        q = self._idle.get(origin.key)
        if q is None:
            q = self._idle[origin.key] = deque()
        q.append(conn)
        if self._sweep_timer is None:
            self._sweep_timer = loop.call_later(self.keepalive_s, self._sweep)
        if self._waiters:  # session 18: no call when no request waits for a connection (the usual case)
            self._wake_one()

    def _sweep(self) -> None:
        """Close idle connections older than ``keepalive_s``; again later while any stay idle."""
        self._sweep_timer = None
        loop = asyncio.get_running_loop()
        oldest_ok = loop.time() - self.keepalive_s
        left = False
        for q in self._idle.values():
            while q and (q[0].idle_since <= oldest_ok or q[0].closed):
                q.popleft().abort()
            left = left or bool(q)
        if left and not self.closed:
            self._sweep_timer = loop.call_later(self.keepalive_s, self._sweep)

    def _closed(self, conn: UpstreamConnection) -> None:
        self._conns.discard(conn)
        if conn.counted:
            conn.counted = False
            self._release_slot()

    def _release_slot(self) -> None:
        self._open -= 1
        if self._open == 0:
            self._loop = None  # no connection left: the next request looks its loop up again
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            w = self._waiters.popleft()
            if not w.done():
                w.set_result(None)
                return
