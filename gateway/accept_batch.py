"""Accept every waiting connection at each wake-up of a listener on uvloop (issue 14, session 23).

Why: libuv accepts **one** connection per event-loop iteration since 1.45 (libuv PR #3696, "unix: don't
accept() connections in a loop"; uvloop 0.23 bundles libuv 1.52). When the gateway's loop is saturated
(a burst of streamed answers: each iteration runs hundreds of relay callbacks and takes milliseconds),
new connections are accepted at one per iteration and wait in the kernel's accept queue, handshake
done, before any of the gateway's code sees them. Measured in the grid's Azure cell at time scale 8
(bench/results/azure-s23-*.md): up to ~240 connections queued on the listening socket, requests on new
connections reaching the app 1-4 s after the client sent them, requests on kept-alive connections
~10-40 ms: most of PrefixGate's TTFT there. asyncio's own loop accepts up to ``backlog`` connections per
wake-up; SGLang's router (tokio) accepts in a loop too.

:class:`BatchAcceptLoop` is uvloop's loop with one change: a TCP server created with
:meth:`create_server` (uvicorn's call: ``host``/``port`` or ``sock``, ``ssl`` None, ``backlog``) is served
by :class:`BatchAcceptServer`, which watches each listening socket with ``add_reader`` and accepts up to
:data:`MAX_ACCEPTS_PER_WAKEUP` connections per wake-up, handing each to uvloop's
``connect_accepted_socket`` (asyncio's public API for sockets accepted outside the loop): the same
transport class, the same protocol factory, so every guard of the listener applies unchanged. Any other
server (Unix sockets, other options) is uvloop's own; a TLS one is refused (TLS ends at the proxy in front).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Callable, Iterable
from typing import Any

import uvloop

__all__ = ["ACCEPT_RETRY_DELAY_S", "BatchAcceptLoop", "BatchAcceptServer", "MAX_ACCEPTS_PER_WAKEUP", "bind_tcp"]

log = logging.getLogger("gateway.accept_batch")

#: the most connections accepted per wake-up of one listening socket (asyncio accepts up to ``backlog``; a
#: bound keeps one wake-up's work finite under a connection flood: the rest are accepted at the next one)
MAX_ACCEPTS_PER_WAKEUP = 128
#: seconds a listening socket is not watched after the process or system ran out of descriptors or memory
#: (EMFILE, ENFILE, ENOBUFS, ENOMEM), as asyncio's ``constants.ACCEPT_RETRY_DELAY``
ACCEPT_RETRY_DELAY_S = 1.0
_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def bind_tcp(host: str | Iterable[str] | None, port: int | None, backlog: int) -> list[socket.socket]:
    """Listening TCP sockets for ``host`` (a name or address, several, or None: every interface) and ``port``
    (0 or None: a free port), as ``loop.create_server(host=, port=)`` binds them: one per address
    ``getaddrinfo`` gives (passive), ``SO_REUSEADDR``, IPv6 sockets ``IPV6_V6ONLY``, non-blocking, listening
    with ``backlog``. Raises :class:`OSError` naming the address (the sockets bound so far are closed)."""
    hosts = [host] if host is None or isinstance(host, str) else list(host)
    infos: list[Any] = []
    for h in hosts:
        for info in socket.getaddrinfo(h or None, port or 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE):
            if info not in infos:
                infos.append(info)
    out: list[socket.socket] = []
    try:
        for family, type_, proto, _name, address in infos:
            sock = socket.socket(family, type_, proto)
            out.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise OSError(exc.errno, f"error while attempting to bind on address {address!r}: "
                                         f"{(exc.strerror or '').lower()}") from None
            sock.setblocking(False)
            sock.listen(backlog)
    except BaseException:
        for sock in out:
            sock.close()
        raise
    return out


class BatchAcceptServer(asyncio.AbstractServer):
    """A TCP server on ``sockets`` (bound; each is put in listening mode with ``backlog`` and made
    non-blocking) whose connections get protocols from ``protocol_factory``; serves at once.

    Each wake-up of a listening socket accepts up to :data:`MAX_ACCEPTS_PER_WAKEUP` connections (TCP_NODELAY
    set, as uvloop sets it on the connections it accepts) and starts one task per connection that hands it
    to ``loop.connect_accepted_socket`` (a connection whose hand-over fails is closed and logged at debug
    level). ``ECONNABORTED`` skips that connection; running out of descriptors or memory stops watching the
    socket for :data:`ACCEPT_RETRY_DELAY_S` seconds (logged). :meth:`close` stops accepting and closes the
    listening sockets (open connections are the protocol's, as with asyncio's servers)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, protocol_factory: Callable[[], asyncio.BaseProtocol],
                 sockets: list[socket.socket], backlog: int = 100) -> None:
        self._loop = loop
        self._factory = protocol_factory
        self._sockets = list(sockets)
        self._closed = False
        self._handing: set[asyncio.Task[None]] = set()  # hand-overs running (strong references)
        self._retry: dict[int, asyncio.TimerHandle] = {}
        for sock in self._sockets:
            sock.setblocking(False)
            sock.listen(backlog)
            loop.add_reader(sock.fileno(), self._accept, sock)

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        """The listening sockets (empty once closed)."""
        return tuple(self._sockets)

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(MAX_ACCEPTS_PER_WAKEUP):
            try:
                conn, _addr = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as exc:
                if exc.errno in _OUT_OF_RESOURCES:
                    log.error("accept failed (%s); not accepting for %g s", exc.strerror, ACCEPT_RETRY_DELAY_S)
                    self._loop.remove_reader(sock.fileno())
                    self._retry[sock.fileno()] = self._loop.call_later(ACCEPT_RETRY_DELAY_S, self._resume, sock)
                else:
                    log.error("accept failed: %s", exc)
                return
            conn.setblocking(False)
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            task = self._loop.create_task(self._hand_over(conn))
            self._handing.add(task)
            task.add_done_callback(self._handing.discard)

    async def _hand_over(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)  # type: ignore[arg-type]
        except Exception as exc:  # the peer reset it meanwhile, or the loop is closing: nothing to serve
            log.debug("accepted connection not handed over: %r", exc)
            conn.close()

    def _resume(self, sock: socket.socket) -> None:
        self._retry.pop(sock.fileno(), None)
        if not self._closed:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def close(self) -> None:
        """Stop accepting and close the listening sockets (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for handle in self._retry.values():
            handle.cancel()
        self._retry.clear()
        for sock in self._sockets:
            self._loop.remove_reader(sock.fileno())
            sock.close()
        self._sockets = []

    async def wait_closed(self) -> None:
        """Return once :meth:`close` was called and the connections accepted before it were handed over."""
        while not self._closed:
            await asyncio.sleep(0.05)
        if self._handing:
            await asyncio.gather(*self._handing, return_exceptions=True)

    def is_serving(self) -> bool:
        """True until :meth:`close`."""
        return not self._closed

    def get_loop(self) -> asyncio.AbstractEventLoop:
        """The event loop serving the sockets."""
        return self._loop

    async def start_serving(self) -> None:
        """Nothing to do: the server serves from its creation."""

    async def serve_forever(self) -> None:
        """Wait until :meth:`close` (the server serves from its creation)."""
        while not self._closed:
            await asyncio.sleep(0.5)


class BatchAcceptLoop(uvloop.Loop):  # type: ignore[misc]
    """uvloop's event loop whose plain TCP servers accept every waiting connection per wake-up
    (:class:`BatchAcceptServer`); everything else is uvloop's."""

    async def create_server(self, protocol_factory: Callable[[], asyncio.BaseProtocol], host: Any = None,
                            port: int | None = None, *, sock: socket.socket | None = None, ssl: Any = None,
                            backlog: int = 100, **kw: Any) -> asyncio.AbstractServer:
        """As ``loop.create_server``; served by :class:`BatchAcceptServer` when it is a plain TCP server
        (no other option, ``sock`` if given a stream socket of an IP family), by uvloop otherwise. Raises as
        ``create_server`` does (:class:`OSError` when an address cannot be bound), and :class:`ValueError` for
        ``ssl``: the gateway's listeners serve no TLS (TLS ends at the proxy in front, docs/security.md;
        tests/security/test_s19_tls_clients.py)."""
        if ssl is not None:
            raise ValueError("BatchAcceptLoop serves no TLS listener: TLS ends at the proxy in front of the gateway")
        plain = not kw
        if plain and sock is not None:
            plain = sock.type == socket.SOCK_STREAM and sock.family in (socket.AF_INET, socket.AF_INET6)
        if not plain:
            return await super().create_server(protocol_factory, host, port, sock=sock, backlog=backlog, **kw)
        sockets = [sock] if sock is not None else bind_tcp(host, port, backlog)
        return BatchAcceptServer(self, protocol_factory, sockets, backlog)
