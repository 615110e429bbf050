"""Run the public and admin listeners in one event loop with uvicorn.

uvicorn's proxy-header rewriting stays off (``proxy_headers=False``): the
client address used for source limits and for trusting a forwarded client
certificate is the socket peer, never an ``X-Forwarded-For`` value.

Event loop and HTTP parser (issue 14): ``prefixgate serve`` runs on uvloop
(:func:`run_serving`) and parses HTTP/1.1 with httptools by default
(``server.http_parser``: ``httptools`` or ``h11``); both parsers pass the
framing tests of tests/hostile/test_i10_http_framing.py.

Shutdown: SIGTERM or SIGINT makes both listeners stop accepting, in-flight
requests and streams drain (up to ``timeout_graceful_shutdown`` seconds),
then the components stop — the audit log flushes every sink and writes its
final signed checkpoint — and only then does the process exit. (uvicorn's
own handlers would re-raise the signal before that final step.)
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from collections.abc import Callable, Coroutine, Generator
from typing import Any, TypeVar

import uvicorn

from gateway.app import build_admin_app, build_public_app
from gateway.build import Gateway, build
from gateway.config import GatewayConfig, LimitsConfig
from gateway.http_guard import guarded_protocol
from gateway.lingering import lingering_cap
from gateway.log_aggregate import install as install_log_aggregation
from gateway.source_cap import uncapped_listener_warnings

__all__ = ["serve", "uvicorn_config", "GatewayServer", "bind_listener", "bind_listeners", "ListenerUnavailable",
           "run_serving", "DEFAULT_HTTP_PARSER", "log_start_warnings"]

DRAIN_TIMEOUT_S = 30
#: uvicorn's HTTP/1.1 parser unless configured (``server.http_parser``): the C parser.
DEFAULT_HTTP_PARSER = "httptools"
T = TypeVar("T")


log = logging.getLogger("prefixgate")


class GatewayServer(uvicorn.Server):
    """A uvicorn server whose signals are handled by :func:`serve` (not re-raised).

    ``name`` labels the listener in log lines; ``on_started(server)`` is called
    once it listens (its sockets are then bound: :meth:`addresses`).
    """

    def __init__(self, config: uvicorn.Config, name: str = "public",
                 on_started: Callable[[GatewayServer], None] | None = None) -> None:
        super().__init__(config)
        self.name = name
        self.on_started = on_started

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:  # noqa: D401 - uvicorn hook
        yield

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start-up, then ``on_started`` if the listener is up."""
        await super().startup(sockets)
        if self.started and self.on_started is not None:
            self.on_started(self)

    def addresses(self) -> list[str]:
        """``http://host:port`` of every bound socket (the real port when configured as 0)."""
        out = []
        for srv in getattr(self, "servers", []):
            for sock in srv.sockets:
                host, port = sock.getsockname()[:2]
                out.append(f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}")
        return out


def uvicorn_config(app: object, host: str, port: int, *, limits: LimitsConfig | None = None,
                   max_connections_per_source: int | None = None,
                   client_send_buffer_bytes: int | None = None, **kw: object) -> uvicorn.Config:
    """uvicorn settings shared by both listeners (no proxy headers, no server header).

    ``kw`` overrides or adds ``uvicorn.Config`` arguments. The HTTP parser is
    named explicitly, :data:`DEFAULT_HTTP_PARSER` (``httptools``) unless
    ``kw`` names another (``http="h11"``), never uvicorn's "auto". Both
    parsers are covered by tests/hostile/test_i10_http_framing.py. ``loop``
    says uvloop; it takes effect where the loop is created
    (:func:`run_serving`), since :func:`serve` runs inside a running loop.

    The parser name is replaced by the protocol class of
    :func:`gateway.http_guard.guarded_protocol`, which bounds request heads
    (``limits.max_header_bytes``, ``limits.header_read_timeout_s``; the
    defaults of :class:`LimitsConfig` when ``limits`` is None) and, when
    ``max_connections_per_source`` is set (``server.max_connections_per_source``),
    the open connections per source IP of this listener;
    ``limits.max_connections`` becomes uvicorn's ``limit_concurrency``;
    ``limits.max_body_chunks`` bounds chunked bodies (gateway/body_guard.py);
    ``limits.max_header_fields`` the header fields of a head (gateway/head_fields.py);
    the guard's refusals are audited through the :class:`gateway.protocol_audit.ProtocolRefusals`
    attached to ``app`` (gateway/app.py; none attached: not audited);
    ``client_send_buffer_bytes`` (``server.client_send_buffer_bytes``; None: kernel default) is each
    accepted socket's SO_SNDBUF (gateway/send_buffer.py).
    uvicorn's per-request warning lines are aggregated per window
    (:mod:`gateway.log_aggregate`, installed on ``uvicorn.error``).
    """
    limits = limits or LimitsConfig()
    parser = kw.pop("http", DEFAULT_HTTP_PARSER)
    if isinstance(parser, str):
        parser = guarded_protocol(parser, max_header_bytes=limits.max_header_bytes,
                                  header_read_timeout_s=limits.header_read_timeout_s,
                                  max_connections_per_source=max_connections_per_source,
                                  max_body_chunks=limits.max_body_chunks,
                                  lingering_close_bytes=lingering_cap(limits.lingering_close_bytes, limits.max_body_bytes),
                                  lingering_close_s=limits.lingering_close_s,
                                  max_header_fields=limits.max_header_fields)
        parser.guard_client_send_buffer_bytes = client_send_buffer_bytes  # type: ignore[attr-defined]
    kw["http"] = parser
    kw.setdefault("h11_max_incomplete_event_size", limits.max_header_bytes)
    kw.setdefault("limit_concurrency", limits.max_connections)
    kw.setdefault("loop", "uvloop")
    config = uvicorn.Config(
        app, host=host, port=port, proxy_headers=False, server_header=False, access_log=False,
        lifespan="off", timeout_graceful_shutdown=DRAIN_TIMEOUT_S, log_level="warning", **kw,  # type: ignore[arg-type]
    )
    install_log_aggregation()  # after uvicorn configured its loggers (R5-11)
    return config


def bind_listener(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """Bind a TCP listening socket (SO_REUSEADDR; SO_REUSEPORT only with ``reuse_port``, for
    the per-worker sockets of :mod:`gateway.workers`: without it a second gateway on the same
    port must fail). Raises :class:`OSError` (e.g. EADDRINUSE) before anything else of the
    gateway has started."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)
        sock.set_inheritable(False)
    except OSError:
        sock.close()
        raise
    return sock


class ListenerUnavailable(OSError):
    """A listening address cannot be bound. ``str()`` names the listener, its
    configuration section and the address, then the system's reason, e.g.
    ``public listener (listen) 127.0.0.1:8080: Address already in use``."""

    def __init__(self, name: str, section: str, host: str, port: int, exc: OSError) -> None:
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        super().__init__(exc.errno, f"{name} listener ({section}) {where}: {exc.strerror or exc}")


def bind_listeners(cfg: GatewayConfig) -> list[socket.socket]:
    """Bind the public listener (``listen``) then the admin one (``admin``, if configured) with
    :func:`bind_listener`. Raises :class:`ListenerUnavailable` naming the listener that
    failed (the sockets already bound are closed first)."""
    targets = [("public", "listen", cfg.listen.host, cfg.listen.port)]
    if cfg.admin is not None:
        targets.append(("admin", "admin", cfg.admin.host, cfg.admin.port))
    bound: list[socket.socket] = []
    for name, section, host, port in targets:
        try:
            bound.append(bind_listener(host, port))
        except OSError as exc:
            for sock in bound:
                sock.close()
            raise ListenerUnavailable(name, section, host, port, exc) from exc
    return bound


#: the cyclic GC's young-generation threshold after start-up (CPython's default: 700)
GC_YOUNG_THRESHOLD = 5000


def freeze_startup_objects() -> None:
    """Move every object alive after start-up (modules, policy engine, tenant
    registry, tokenizer, routing tables) out of the cyclic GC's reach
    (``gc.freeze``, Python >= 3.7), so full collections only scan what requests
    allocate. Measured in ``bench.audit_overhead`` (2 CPUs): full-collection
    time per request fell from ~35 us to ~7 us and each full collection from
    ~40-55 ms to ~7-11 ms of stalled event loop. Call once, after start-up.

    Then raises the young-generation threshold to :data:`GC_YOUNG_THRESHOLD`
    (only upwards; 0, a disabled GC, stays): at 700 a gen-0 collection came every
    ~13 requests under 32 clients and found almost nothing to free (the in-flight
    requests' objects, scanned again each time), ~38 us of GC CPU per request;
    at 5000 ~5 us (one ~1.8 ms collection every ~350 requests instead of a
    ~0.37 ms one every 13; issue 14, notes/s5-cost.md)."""
    gc.collect()
    gc.freeze()
    young, *older = gc.get_threshold()
    if 0 < young < GC_YOUNG_THRESHOLD:
        gc.set_threshold(GC_YOUNG_THRESHOLD, *older)


def run_serving(main: Coroutine[Any, Any, T], *, batch_accept: bool = True) -> T:
    """Run ``main`` to completion on a new uvloop event loop (asyncio's own loop
    where uvloop is not installed, e.g. on Windows) and return its result.

    ``prefixgate serve`` runs :func:`serve` through this; uvloop's C event
    loop costs less per callback and socket operation than asyncio's
    (bench/overhead.py, docs/benchmarks.md). Its TCP listeners accept every
    waiting connection per wake-up, not libuv's one per loop iteration
    (:class:`gateway.accept_batch.BatchAcceptLoop`; session 23), unless
    ``batch_accept`` is False (a worker of ``serve --workers N`` whose public
    socket is shared with the other workers: there libuv's one accept per
    iteration spreads a burst over the workers awake).
    """
    try:
        import uvloop

        from gateway.accept_batch import BatchAcceptLoop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=BatchAcceptLoop if batch_accept else uvloop.new_event_loop) as runner:
        return runner.run(main)


def log_start_warnings(c: Gateway) -> None:
    """Log, one WARNING line each, the configuration's tenant entries that cannot be served as
    written (``configuration: ...``) and the tenants without a prompt-token limit (``limits: ...``,
    review R3-4) and each listener reachable from other hosts without ``server.max_connections_per_source``
    (``server: ...``, S24-review-4)."""
    for problem in c.configuration_warnings():
        log.warning("configuration: %s", problem)
    for problem in c.limit_warnings():
        log.warning("limits: %s", problem)
    cfg = c.config  # S24-review-4: no per-source connection cap on a listener others can reach
    listeners = [("public", cfg.listen.host)] + ([("admin", cfg.admin.host)] if cfg.admin is not None else [])
    for problem in uncapped_listener_warnings(listeners, cfg.server.max_connections_per_source,
                                              cfg.limits.max_connections, cfg.limits.header_read_timeout_s,
                                              bool(cfg.identity.trusted_proxies)):
        log.warning("server: %s", problem)


async def serve(cfg: GatewayConfig, *, config_path: str | None = None,
                sockets: list[socket.socket] | None = None,
                stop_requested: Callable[[], bool] | None = None, worker: str | None = None) -> None:
    """Bind both listeners, build and start components, serve until a signal, then drain and stop.

    Both addresses are probed *first*: a second gateway started by mistake on
    the same ports fails with :class:`ListenerUnavailable` (an ``OSError`` naming
    the listener and host:port) before it opens the audit log
    directory of the running one (which is also guarded by a lock).
    ``sockets``: listening sockets already bound by a parent process
    (``serve --workers N``, :mod:`gateway.workers`): public first, then admin;
    nothing is probed or bound then. ``stop_requested()``: True when a signal
    arrived before this function installed its handlers (stop at once, cleanly). ``worker``: the
    index of a ``serve --workers N`` worker, a ``worker`` label on both metrics endpoints (S24-newcomer-1).
    """
    # Probe both addresses first (then release them for uvicorn to bind): handing
    # uvicorn pre-bound sockets instead added a ~40 ms p99 stall at 50 req/s
    # (bench/results/bench_overhead.md), so only the check is done here.
    if sockets is None:
        for sock in bind_listeners(cfg):
            sock.close()
    c = build(cfg, config_path=config_path)
    log_start_warnings(c)
    await c.start()
    freeze_startup_objects()
    pending = {"public"} | ({"admin"} if cfg.admin is not None else set())
    announcing: list[asyncio.Task[None]] = []

    def started(server: GatewayServer) -> None:
        for address in server.addresses():
            log.info("listening: %s %s", server.name, address)
        pending.discard(server.name)
        if not pending:
            announcing.append(asyncio.ensure_future(announce_ready(c)))

    http, per_source = cfg.server.http_parser, cfg.server.max_connections_per_source
    # both apps carry their listener's protocol-refusal audit (gateway/protocol_audit.py)
    servers = [GatewayServer(uvicorn_config(build_public_app(c, manage_lifecycle=False, worker=worker),
                                            cfg.listen.host, cfg.listen.port, http=http,
                                            limits=cfg.limits, max_connections_per_source=per_source,
                                            client_send_buffer_bytes=cfg.server.client_send_buffer_bytes),
                             "public", started)]
    if cfg.admin is not None:
        servers.append(GatewayServer(uvicorn_config(build_admin_app(c, worker=worker), cfg.admin.host, cfg.admin.port, http=http,
                                                    limits=cfg.limits, max_connections_per_source=per_source,
                                                    client_send_buffer_bytes=cfg.server.client_send_buffer_bytes),
                                     "admin", started))
    loop = asyncio.get_running_loop()

    def stop_all() -> None:
        if not any(s.should_exit for s in servers):
            log.info("draining: listeners closed, in-flight requests finishing (at most %d s)", DRAIN_TIMEOUT_S)
        for s in servers:
            s.should_exit = True

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop_all)
    if stop_requested is not None and stop_requested():
        stop_all()
    if sockets is None:
        tasks = [asyncio.ensure_future(s.serve()) for s in servers]
    else:
        tasks = [asyncio.ensure_future(s.serve(sockets=[sock])) for s, sock in zip(servers, sockets, strict=False)]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        stop_all()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for task in announcing:
            task.cancel()
        await c.stop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
        log.info("stopped: audit flushed, exiting")


async def announce_ready(c: Gateway, retry_s: float = 1.0) -> None:
    """Log ``ready: <startup_summary>`` once the trust bundles have loaded (R3-13).

    Called when every listener listens. Loads each trust domain's bundle
    (``Readiness.bundle_problems``: what ``/readyz`` checks, refreshed only
    when due), so the ready line never precedes the first bundle load. While
    no bundle is usable it logs one warning naming the problem and retries
    every ``retry_s`` seconds (``/readyz`` answers 503 meanwhile)."""
    problems = await c.readiness.bundle_problems()
    if problems:
        log.warning("not ready yet: %s (retrying every %g s)", "; ".join(problems), retry_s)
    while problems:
        await asyncio.sleep(retry_s)
        problems = await c.readiness.bundle_problems()
    log.info("ready: %s", startup_summary(c))


def startup_summary(c: Gateway) -> str:
    """One line: policy mode and directory (or URL), tenants, trust domains and replicas."""
    pc = c.config.policy
    where = f"url {pc.url}" if pc.mode == "remote" else f"dir {pc.resolved_dir()}"
    return (f"policy {pc.mode} ({where}), {len(c.registry)} tenants, "
            f"{len(c.config.identity.trust_domains)} trust domains, {len(c.config.replicas)} replicas")
