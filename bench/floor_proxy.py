"""The CPython floor of a reverse proxy for bench.overhead's request (issue 14; a bench target, not product code).

``python -m bench.floor_proxy --upstream http://127.0.0.1:PORT --port PORT``

Why: issue 14 asks, if a target is out of reach on CPython, "what the
passthrough floor is". The ``passthrough`` target of :mod:`bench.overhead`
runs on PrefixGate's own stack (uvicorn + ASGI + Starlette + the aiohttp
upstream session); this target is the leanest proxy one can write on CPython
for that benchmark's request, so the note can say what a bare CPython proxy
reaches on the same machine in the same run:

* one uvloop event loop, one ``asyncio.Protocol`` per client connection,
  ``httptools`` parsing requests (C, llhttp) and answers;
* no ASGI, no tasks, no coroutines: every step is a parser or transport
  callback;
* one keep-alive upstream connection per client connection (opened with the
  client connection, returned to an idle list when the client goes, reused
  by the next one), so a sequential client uses exactly one upstream
  connection and 64 closed-loop clients use 64;
* requests forwarded as ``METHOD PATH HTTP/1.1`` with ``Host``,
  ``Content-Type`` and ``Content-Length`` (the body in the same write);
  answers relayed with status, ``Content-Type`` and ``Content-Length`` (a
  body without a length, e.g. SSE, is relayed chunk by chunk with
  ``Transfer-Encoding: chunked``).

It checks nothing (no limits, no framing guards, no flow control, no
timeouts): it is a lower bound, not a design. A request that fails to parse,
or an upstream that fails, gets ``502``/``400`` and the connection closes.
``GET /healthz`` answers ``ok`` locally. Serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections import deque
from typing import Any
from urllib.parse import urlsplit

import httptools

__all__ = ["FloorProxy", "main"]

_REASONS = {200: b"OK", 400: b"Bad Request", 404: b"Not Found", 502: b"Bad Gateway"}
_HEALTH = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"
_BAD = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_GONE = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class FloorProxy:
    """Shared state: the upstream ``host``/``port`` and the idle upstream connections."""

    def __init__(self, upstream: str) -> None:
        u = urlsplit(upstream)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.host_line = b"Host: %s:%d\r\n" % (self.host.encode(), self.port)
        self.idle: list[_Upstream] = []


class _Upstream(asyncio.Protocol):
    """One keep-alive upstream connection; relays each answer to its current client connection."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: Any = None
        self.client: _Client | None = None
        self.ctype = b"application/octet-stream"
        self.length: bytes | None = None
        self.body: list[bytes] = []
        self.chunked = False
        self.alive = True

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.connection_lost(None)

    def connection_lost(self, exc: BaseException | None) -> None:
        self.alive = False
        if self.client is not None:
            self.client.upstream_lost()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.ctype, self.length, self.body, self.chunked = b"application/octet-stream", None, [], False

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-type":
            self.ctype = value
        elif lower == b"content-length":
            self.length = value

    def on_headers_complete(self) -> None:
        if self.length is None and self.client is not None:  # no length: relay as it comes, chunked
            self.chunked = True
            status = self.parser.get_status_code()
            self.client.transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
                                        % (status, _REASONS.get(status, b"Status"), self.ctype))

    def on_body(self, body: bytes) -> None:
        if self.chunked:
            if self.client is not None:
                self.client.transport.write(b"%x\r\n%s\r\n" % (len(body), body))
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        client = self.client
        if client is None:
            return
        if self.chunked:
            client.transport.write(b"0\r\n\r\n")
        else:
            status = self.parser.get_status_code()
            body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
            client.transport.write(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
                                   % (status, _REASONS.get(status, b"Status"), self.ctype, len(body), body))
        client.answered()


class _Client(asyncio.Protocol):
    """One client connection: httptools parses; each complete request goes to this connection's upstream."""

    def __init__(self, proxy: FloorProxy) -> None:
        self.proxy = proxy
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.upstream: _Upstream | None = None
        self.waiting: deque[bytes] = deque()  # requests held until the upstream connection is open
        self.in_flight = 0
        self.url = b""
        self.ctype = b"application/json"
        self.body: list[bytes] = []
        self.close_after = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        idle = self.proxy.idle
        while idle:
            up = idle.pop()
            if up.alive:
                self.attach(up)
                return
        asyncio.get_running_loop().create_task(self.connect())

    async def connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, up = await loop.create_connection(_Upstream, self.proxy.host, self.proxy.port)
        except OSError:
            self.transport.write(_GONE)
            self.transport.close()
            return
        if self.transport.is_closing():
            self.proxy.idle.append(up)
            return
        self.attach(up)

    def attach(self, up: _Upstream) -> None:
        self.upstream = up
        up.client = self
        if self.waiting:
            up.transport.writelines(self.waiting)
            self.waiting.clear()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self.transport.write(_BAD)
            self.transport.close()

    def connection_lost(self, exc: BaseException | None) -> None:
        up, self.upstream = self.upstream, None
        if up is not None:
            up.client = None
            if up.alive and not self.in_flight:
                self.proxy.idle.append(up)
            else:
                up.transport.close()

    def upstream_lost(self) -> None:
        self.upstream = None
        if self.in_flight:
            self.transport.write(_GONE)
        self.transport.close()

    def answered(self) -> None:
        self.in_flight -= 1
        if self.close_after and not self.in_flight:
            self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url, self.ctype, self.body = b"", b"application/json", []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.ctype = value

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        if not self.parser.should_keep_alive():
            self.close_after = True
        if method == b"GET" and self.url == b"/healthz":
            self.transport.write(_HEALTH)
            return
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        out = (b"%s %s HTTP/1.1\r\n%sContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s"
               % (method, self.url, self.proxy.host_line, self.ctype, len(body), body))
        self.in_flight += 1
        up = self.upstream
        if up is not None:
            up.transport.write(out)
        else:
            self.waiting.append(out)


async def serve(upstream: str, host: str, port: int) -> None:
    """Listen on ``host:port`` and proxy to ``upstream`` until SIGTERM or SIGINT."""
    loop = asyncio.get_running_loop()
    proxy = FloorProxy(upstream)
    server = await loop.create_server(lambda: _Client(proxy), host, port, backlog=2048)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    server.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``--upstream URL --port N [--host H]``."""
    import uvloop

    from sim.click_options import ClickOptions

    ap = ClickOptions(prog="python -m bench.floor_proxy", description=__doc__.splitlines()[0])
    ap.option("--upstream", required=True)
    ap.option("--port", type=int, required=True)
    ap.option("--host", default="127.0.0.1")
    a = ap.parse(argv)
    uvloop.run(serve(a.upstream, a.host, a.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
