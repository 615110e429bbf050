"""``prefixgate serve --workers N``: N gateway processes on one host, one listening port.

The parent first binds the public (and admin) address with
:func:`gateway.server.bind_listener` *without* ``SO_REUSEPORT`` (a probe: it
fails with :class:`gateway.server.ListenerUnavailable` if anything holds the
port, e.g. a second gateway). With ``server.listener_per_worker`` (default) on
Linux it then closes the public probe and binds N public sockets *with*
``SO_REUSEPORT`` (:func:`bind_worker_listeners`), one per worker: the kernel
hashes each new connection (its address 4-tuple) to one of them, so a load
generator opening many connections at once reaches every worker (with one shared
socket the first worker awake could accept nearly all; notes/s6-workers.md). A
later gateway's probe bind fails with EADDRINUSE while ours are bound; only a
process of the same effective UID that also sets ``SO_REUSEPORT`` could join the
group (the kernel's rule), and between the probe's close and the first
``SO_REUSEPORT`` bind (microseconds) such a process could slip in
(docs/scale-out.md). The admin listener stays one socket shared by all workers
(operator traffic: few connections, no spread needed, and it stays exclusive
without any window). Elsewhere, or with ``listener_per_worker: false``, every
worker shares the public probe socket too.

Worker ``i`` is a ``python -m gateway.cli serve --worker-index i`` child that
gets only its own public socket and the admin one (``pass_fds``; their numbers in
``PREFIXGATE_LISTEN_FDS``) and accepts on them. Allowed only with
``state.backend: redis`` (:func:`gateway.cli.serving_refusal`): tenant limits,
the ledger and concurrency are shared through Redis (docs/scale-out.md says
what else is).

Each worker has its own audit chain: ``audit.jsonl.dir`` and
``audit.spill.dir`` get a ``worker-<i>`` subdirectory, ``audit.ocsf.file`` a
``.worker-<i>`` suffix, and ``audit.instance`` = ``<host>/w<i>`` is stamped
on every event (:class:`audit.log.AuditLog`); ``prefixgate audit verify``
checks each worker's directory. Every metric sample a worker exposes carries ``worker="<i>"``
(:mod:`gateway.metrics_worker`; session 24, S24-newcomer-1): a scrape reads one worker.

The parent forwards SIGTERM/SIGINT to every worker (each drains and seals its
audit log; one still starting stops as soon as it can, see
:func:`catch_early_stop`) and exits when all have; a worker that exits on its own makes the
parent stop the others and exit 1 (a supervisor restarts the whole gateway).
With per-worker sockets, connections already queued in the exiting worker's
backlog are reset by the kernel when its socket closes (unless the host sets
``net.ipv4.tcp_migrate_req``); the rest of the gateway stops anyway.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from audit.config_schema import AuditSection
from gateway.child_python import child_env, python_module_argv
from gateway.config import GatewayConfig
from gateway.server import ListenerUnavailable, bind_listener, bind_listeners

__all__ = ["ENV_LISTEN_FDS", "bind_worker_listeners", "catch_early_stop", "inherited_sockets", "per_worker_supported",
           "run_workers", "worker_config"]

#: Environment variable naming the inherited listening sockets: ``<public fd>[,<admin fd>]``.
ENV_LISTEN_FDS = "PREFIXGATE_LISTEN_FDS"

log = logging.getLogger("prefixgate")


def worker_config(cfg: GatewayConfig, index: int, host: str | None = None) -> GatewayConfig:
    """``cfg`` for worker ``index``: its own audit directories and file, ``audit.instance`` =
    ``<host>/w<index>`` (``host``: this machine's name by default). Other sections unchanged."""
    audit: dict[str, Any] = cfg.audit.model_dump(exclude_unset=True)
    suffix = f"worker-{index}"
    for section in ("jsonl", "spill"):
        sub = audit.get(section)
        if isinstance(sub, dict) and sub.get("dir"):
            sub["dir"] = os.path.join(str(sub["dir"]), suffix)
    ocsf = audit.get("ocsf")
    if isinstance(ocsf, dict) and ocsf.get("file"):
        ocsf["file"] = f"{ocsf['file']}.{suffix}"
    audit["instance"] = f"{host or socket.gethostname()}/w{index}"
    return cfg.model_copy(update={"audit": AuditSection.model_validate(audit)})


def catch_early_stop() -> Callable[[], bool]:
    """Catch SIGTERM/SIGINT from now on (a worker calls this first) and return ``requested()``:
    True once one arrived. :func:`gateway.server.serve` replaces these handlers with its own
    once its event loop runs and then stops at once if ``requested()``, so a worker stopped
    while starting still drains and seals its audit log instead of dying mid-start."""
    got: list[int] = []

    def note(signum: int, _frame: object) -> None:
        got.append(signum)

    signal.signal(signal.SIGTERM, note)
    signal.signal(signal.SIGINT, note)
    return lambda: bool(got)


def inherited_sockets(env: dict[str, str] | None = None) -> list[socket.socket]:
    """The listening sockets the parent passed (``PREFIXGATE_LISTEN_FDS``), public first.

    Raises :class:`RuntimeError` when the variable is absent or names no socket."""
    raw = (env if env is not None else os.environ).get(ENV_LISTEN_FDS, "")
    fds = [int(x) for x in raw.split(",") if x.strip()]
    if not fds:
        raise RuntimeError(f"{ENV_LISTEN_FDS} is not set: --worker-index is for processes started by --workers")
    return [socket.socket(fileno=fd) for fd in fds]


def per_worker_supported() -> bool:
    """True where the kernel spreads connections across ``SO_REUSEPORT`` listeners (Linux)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def bind_worker_listeners(cfg: GatewayConfig, workers: int) -> tuple[list[socket.socket], list[socket.socket]]:
    """Bind the listeners of ``workers`` workers: ``(public, admin)``.

    ``public``: ``workers`` ``SO_REUSEPORT`` sockets on one port (``server.listener_per_worker``
    on Linux), bound after a probe bind without ``SO_REUSEPORT`` that fails if anything holds
    the port; else one socket shared by all. ``admin``: ``[]`` or one shared socket.
    Raises :class:`ListenerUnavailable` (every socket already bound is closed first)."""
    probes = bind_listeners(cfg)  # no SO_REUSEPORT: fails if a gateway (or anything) holds a port
    public, admin = probes[:1], probes[1:]
    if workers < 2 or not cfg.server.listener_per_worker or not per_worker_supported():
        return public, admin
    port = public[0].getsockname()[1]  # the port the probe got (listen.port 0: a free one)
    public[0].close()
    group: list[socket.socket] = []
    try:
        for _ in range(workers):
            group.append(bind_listener(cfg.listen.host, port, reuse_port=True))
    except OSError as exc:  # taken in the window since the probe closed
        for sock in group + admin:
            sock.close()
        raise ListenerUnavailable("public", "listen", cfg.listen.host, port, exc) from exc
    return group, admin


def run_workers(cfg: GatewayConfig, config_path: str, workers: int) -> int:
    """Bind the listeners, start ``workers`` worker processes, wait for them; return the exit code.

    Raises :class:`gateway.server.ListenerUnavailable` (an :class:`OSError` naming the listener
    and its address) when a listening address is taken (before any worker starts)."""
    public, admin = bind_worker_listeners(cfg, workers)
    per_worker = len(public) > 1
    for name, s in [("public", public[0]), *(("admin", a) for a in admin)]:
        host, port = s.getsockname()[:2]
        how = "a socket per worker, SO_REUSEPORT" if name == "public" and per_worker else "shared"
        log.info("listening: %s http://%s:%d (%d workers, %s)", name, host, port, workers, how)
    argv = python_module_argv("gateway.cli", "serve", "--config", config_path)  # -P: R12-4
    alive: dict[int, int] = {}
    signalled: set[int] = set()
    stopping = False

    def stop(signum: int = signal.SIGTERM, _frame: object = None) -> None:
        nonlocal stopping
        stopping = True
        for pid in list(alive):
            if pid not in signalled:
                signalled.add(pid)
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass

    # The handlers go in before the first worker starts: a SIGTERM that arrived while the
    # workers were being started used to kill the parent (default action, exit -15) and
    # leave the workers already started running on the inherited sockets.
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for i in range(workers):
        if stopping:  # stopped while starting: start no more
            break
        fds = [public[i if per_worker else 0].fileno(), *(a.fileno() for a in admin)]
        env = {**child_env(), ENV_LISTEN_FDS: ",".join(map(str, fds))}
        proc = subprocess.Popen([*argv, "--worker-index", str(i)], env=env, pass_fds=fds)
        alive[proc.pid] = i
        if stopping:  # the signal came while this one was being started (not yet in ``alive``)
            stop()
    for s in public + admin:  # the workers hold them now (those of workers never started: closed)
        s.close()
    rc = 0
    while alive:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        index = alive.pop(pid, None)
        if index is None:
            continue
        code = os.waitstatus_to_exitcode(status)
        if not stopping:
            log.error("worker %d exited on its own (code %d): stopping the other workers", index, code)
            rc = 1
            stop()
        elif code == -signal.SIGTERM:
            # killed by our SIGTERM before catch_early_stop ran: still importing, nothing opened yet
            log.info("worker %d stopped before it had started", index)
        elif code != 0:
            log.warning("worker %d exited with code %d while stopping", index, code)
            rc = rc or 1
    log.info("stopped: all %d workers exited", workers)
    return rc
