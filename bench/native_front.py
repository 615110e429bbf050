"""A protocol-native HTTP/1.1 front for an ASGI app: what a front below uvicorn would buy (issue 14; bench only).

``python -m bench.native_front --passthrough URL --port N`` (bench.overhead's passthrough app) or
``python -m bench.native_front --gateway-config FILE`` (the real PrefixGate public app, built and
started as ``prefixgate serve`` does, on ``listen.host``/``listen.port`` of FILE).

Why: session 21's closing note names one lever left for issue 14's 0.5 ms target, "a protocol-native
request path below uvicorn's ASGI cycle". This module sizes it with an *optimistic* prototype: the
same ASGI app (the same scope keys the guarded uvicorn listener gives it, so the app's shortcuts
apply) under the least per-request work one can write on uvloop + httptools with public APIs only:

* one ``asyncio.Protocol`` per connection, ``httptools.HttpRequestParser`` callbacks; keep-alive
  (HTTP/1.1 default, ``Connection: close`` and HTTP/1.0 honoured);
* a request is dispatched when its body is complete (Content-Length or chunked request bodies,
  buffered whole): one task per request (``loop.create_task``), no other task, timer or future
  unless the app waits on ``receive`` after the body (a disconnect waiter);
* the scope is built in one dict literal; ``receive`` hands the whole body once, then waits for the
  disconnect; ``send`` holds the response head until the first body part and writes both in one
  ``transport.write`` (a plain answer: one write); an answer without ``Content-Length`` is sent
  ``Transfer-Encoding: chunked``, each part one write;
* the app's scope extras of the guarded uvicorn listener (gateway/http_guard.py): the connection's
  :class:`gateway.client_io.ConnectionLoss` (``LOSS_KEY``, with ``abort`` and ``unsent``), the send
  order stamp (``gateway.send_order.SCOPE_KEY``), the body's wire count (``WIRE_SCOPE_KEY``) and
  ``BODY_COMPLETE_KEY`` (the body is always whole at dispatch).

It is a LOWER BOUND of a real front, not a design: it has none of the guards a production front must
keep (gateway/http_guard.py, head_guard.py, head_fields.py, head_scan.py, upgrade_guard.py,
body_guard.py, drop_guard.py, lingering.py, send_buffer.py, protocol_audit.py: head size and field
count bounds, head read timeout, per-source connection limit, chunk count and framing-byte bounds,
trailer refusal, upgrade/CONNECT refusal, ``#`` in targets, Host checks, lingering close, refusal
audit) and none of uvicorn's features (keep-alive timeout, ``limit_concurrency``, write flow control
(``pause_writing``/backpressure), request pipelining (a request that arrives before the previous
answer ends is parsed but its answer is not ordered), ``Expect: 100-continue``, graceful drain on
shutdown, access/error logging, a 500 for an app that fails before its answer starts beyond a bare one).
A parse error answers 400 and closes; the app's exception closes the connection.
"""

from __future__ import annotations

import asyncio
import http
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any
from urllib.parse import unquote

import httptools

from gateway.body_guard import BODY_COMPLETE_KEY, WIRE_SCOPE_KEY, BodyWire
from gateway.client_io import LOSS_KEY, ConnectionLoss
from gateway.send_order import SCOPE_KEY as SENDS_KEY, SEND_ORDER

__all__ = ["NativeFront", "serve_app", "start_front", "start_target", "main"]

Message = MutableMapping[str, Any]
ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]

log = logging.getLogger("bench.native_front")

#: status code -> b"HTTP/1.1 <code> <reason>\r\n"
_STATUS_LINES = {int(s): b"HTTP/1.1 %d %s\r\n" % (s, s.phrase.encode()) for s in http.HTTPStatus}
_BAD = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_FAILED = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_ASGI = {"version": "3.0", "spec_version": "2.3"}  # as uvicorn says: the app's 2.3 stream path (LOSS_KEY)
_METHODS: dict[bytes, str] = {}


class NativeFront:
    """Shared state of one listener: the ASGI ``app`` and the listener's ``(host, port)``."""

    def __init__(self, app: ASGIApp, host: str, port: int) -> None:
        self.app = app
        self.server_addr = (host, port)

    def protocol(self) -> _Connection:
        """A new connection protocol (the ``protocol_factory`` of ``loop.create_server``)."""
        return _Connection(self)


class _Connection(asyncio.Protocol):
    """One client connection: httptools parses, each complete request runs the app in one task."""

    def __init__(self, front: NativeFront) -> None:
        self.front = front
        self.app = front.app
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.loop = asyncio.get_running_loop()
        self.client: tuple[str, int] | None = None
        self.loss = ConnectionLoss()
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.body: list[bytes] = []
        self.scope: dict[str, Any] | None = None
        self.cycle: _Cycle | None = None

    # asyncio.Protocol
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.client = (peer[0], peer[1]) if peer else None
        self.loss.abort = transport.abort
        self.loss.unsent = transport.get_write_buffer_size

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse()
        except httptools.HttpParserError:
            self._refuse()

    def connection_lost(self, exc: BaseException | None) -> None:
        self.loss.fire()
        cycle = self.cycle
        if cycle is not None:
            cycle.disconnected()

    def _refuse(self) -> None:
        if self.cycle is None:
            self.transport.write(_BAD)
        self.transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.body = []

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        parsed = httptools.parse_url(self.url)
        raw_path = parsed.path
        method = self.parser.get_method()
        name = _METHODS.get(method)
        if name is None:
            name = _METHODS[method] = method.decode("ascii")
        path = raw_path.decode("latin-1")
        self.scope = {
            "type": "http", "asgi": _ASGI, "http_version": self.parser.get_http_version(),
            "server": self.front.server_addr,
            "client": self.client, "scheme": "http", "method": name, "root_path": "",
            "path": unquote(path) if "%" in path else path, "raw_path": raw_path, "query_string": parsed.query or b"",
            "headers": self.headers, "state": {},
            SENDS_KEY: SEND_ORDER.sends, LOSS_KEY: self.loss, WIRE_SCOPE_KEY: BodyWire(),
        }

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        scope = self.scope
        if scope is None:
            return
        self.scope = None
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        scope[WIRE_SCOPE_KEY].bytes = len(body)
        scope[BODY_COMPLETE_KEY] = True
        cycle = self.cycle = _Cycle(self, body, self.parser.should_keep_alive())
        self.loop.create_task(cycle.run(scope))

    def cycle_done(self, cycle: _Cycle) -> None:
        if self.cycle is cycle:
            self.cycle = None
        if not cycle.keep_alive:
            self.transport.close()


class _Cycle:
    """One request's ``receive`` and ``send`` (the body whole; the answer's head held until its first part)."""

    __slots__ = ("conn", "transport", "body", "keep_alive", "head", "chunked", "started", "done", "gone", "waiter")

    def __init__(self, conn: _Connection, body: bytes, keep_alive: bool) -> None:
        self.conn = conn
        self.transport = conn.transport
        self.body: bytes | None = body
        self.keep_alive = keep_alive
        self.head = b""
        self.chunked = False
        self.started = False
        self.done = False
        self.gone = False
        self.waiter: asyncio.Future[None] | None = None

    async def run(self, scope: MutableMapping[str, Any]) -> None:
        try:
            await self.conn.app(scope, self.receive, self.send)
        except BaseException:
            if not self.started and not self.gone:
                self.transport.write(_FAILED)
            self.keep_alive = False
            if not self.gone:
                log.exception("the app failed")
        finally:
            if not self.done:
                self.keep_alive = False
            self.conn.cycle_done(self)

    def disconnected(self) -> None:
        self.gone = True
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def receive(self) -> Message:
        body = self.body
        if body is not None:
            self.body = None
            return {"type": "http.request", "body": body, "more_body": False}
        if not self.gone and not self.done:
            self.waiter = self.conn.loop.create_future()
            await self.waiter
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if self.gone:
            return  # ASGI 2.3: sends after a disconnect are no-ops
        kind = message["type"]
        if kind == "http.response.body":
            body = message.get("body", b"")
            more = message.get("more_body", False)
            if self.chunked:
                out = b"%x\r\n%s\r\n" % (len(body), body) if body else b""
                if not more:
                    out += b"0\r\n\r\n"
            else:
                out = body
            if self.head:
                out, self.head = self.head + out, b""
            if out:
                self.transport.write(out)
            if not more:
                self.done = True
        elif kind == "http.response.start":
            status = message["status"]
            line = _STATUS_LINES.get(status) or b"HTTP/1.1 %d Status\r\n" % status
            parts = [line]
            length = False
            for name, value in message.get("headers") or ():
                lower = name.lower()
                if lower == b"content-length":
                    length = True
                elif lower == b"connection" and value.lower() == b"close":
                    self.keep_alive = False
                parts.append(b"%s: %s\r\n" % (name, value))
            if not length:
                self.chunked = True
                parts.append(b"transfer-encoding: chunked\r\n")
            if not self.keep_alive:
                parts.append(b"connection: close\r\n")
            parts.append(b"\r\n")
            self.head = b"".join(parts)
            self.started = True


async def serve_app(app: ASGIApp, host: str, port: int, stop: asyncio.Event) -> None:
    """Serve ``app`` on ``host:port`` (``port`` 0: any; the listener's sockets are in the returned
    server's ``sockets``) until ``stop`` is set."""
    server = await start_front(app, host, port)
    try:
        await stop.wait()
    finally:
        server.close()


async def start_front(app: ASGIApp, host: str, port: int) -> asyncio.AbstractServer:
    """Start listening on ``host:port`` with ``app`` under the native front; returns the asyncio server
    (``sockets[0].getsockname()`` has the bound port; ``close()`` stops it)."""
    front = NativeFront(app, host, port)
    server = await asyncio.get_running_loop().create_server(front.protocol, host, port, backlog=2048)
    front.server_addr = tuple(server.sockets[0].getsockname()[:2])  # the bound port when ``port`` is 0
    return server


async def start_target(name: str, run: int, upstream: str, cfg: Mapping[str, Any],
                       paths: Any) -> tuple[Any, str]:
    """Start bench.overhead's target ``name`` (``passthrough-native`` or ``prefixgate-native``, run ``run``) under
    this front as a child process, forwarding to ``upstream`` (passthrough) or serving ``cfg`` (a gateway
    configuration with its own ports and audit directory, as :func:`bench.overhead._second_config` makes);
    ``paths``: the bench's work paths. Returns (process, base URL) once ``/healthz`` (``/readyz``) answers 200."""
    import yaml

    from bench.overhead import _spawn
    from sim.procs import free_port

    if name == "passthrough-native":
        port = free_port()
        return await _spawn(name, ["bench.native_front", "--passthrough", upstream, "--port", str(port)],
                            paths, port, "/healthz")
    cfg_path = paths.work / f"{name}-{run}.yaml"
    cfg_path.write_text(yaml.safe_dump(dict(cfg), sort_keys=False))
    return await _spawn(f"{name}-{run}", ["bench.native_front", "--gateway-config", str(cfg_path)], paths,
                        cfg["listen"]["port"], "/readyz")


def _stop_on_signals() -> asyncio.Event:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    return stop


async def _passthrough(upstream: str, port: int) -> None:
    from bench.overhead import passthrough_app

    await serve_app(passthrough_app(upstream), "127.0.0.1", port, _stop_on_signals())


async def _gateway(config_file: str) -> None:
    """The public app of ``prefixgate serve`` (same build, start, GC settings) under the native front;
    no admin listener. Stops the components (audit flushed) on SIGTERM."""
    from gateway.app import build_public_app
    from gateway.build import build
    from gateway.config import load_config
    from gateway.server import freeze_startup_objects, log_start_warnings

    cfg = load_config(config_file)
    c = build(cfg, config_path=config_file)
    log_start_warnings(c)
    await c.start()
    freeze_startup_objects()
    try:
        await serve_app(build_public_app(c, manage_lifecycle=False), cfg.listen.host, cfg.listen.port,
                        _stop_on_signals())
    finally:
        await c.stop()


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``--passthrough URL --port N`` or ``--gateway-config FILE``."""
    from gateway.server import run_serving
    from sim.click_options import ClickOptions

    ap = ClickOptions(prog="python -m bench.native_front", description=__doc__.splitlines()[0])
    ap.option("--passthrough", default=None, help="upstream URL: serve bench.overhead's passthrough app")
    ap.option("--port", type=int, default=0)
    ap.option("--gateway-config", default=None, help="serve PrefixGate's public app of this configuration")
    a = ap.parse(argv)
    if a.gateway_config:
        from policy import reexec_with_go_gc

        reexec_with_go_gc(["-m", "bench.native_front", *(sys.argv[1:] if argv is None else argv)])  # as serve does
        logging.basicConfig(level=logging.WARNING)
        run_serving(_gateway(a.gateway_config))
    elif a.passthrough:
        run_serving(_passthrough(a.passthrough, a.port))
    else:
        raise SystemExit("error: --passthrough URL or --gateway-config FILE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
