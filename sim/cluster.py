"""Run N simulated replicas in one process (one event loop, one aiohttp app per port).

In-process (tests)::

    cluster = await start_cluster(3, ReplicaConfig(time_scale=100))
    ... cluster.urls ...
    await cluster.stop()

As a subprocess (demo, benchmarks)::

    with spawn_cluster(6, time_scale=60) as cp:
        cp.urls  # ["http://127.0.0.1:PORT", ...]

CLI::

    python -m sim.cluster --replicas 6 --base-port 0 --host 127.0.0.1 \\
        [--time-scale X] [--capacity-blocks N] [--prefill-tokens-per-s R] \\
        [--stream-chunk-tokens K] [--ready-file PATH]

Once every replica listens, the CLI writes a JSON list of
``{"replica_id", "url"}`` to ``--ready-file`` (atomically, via rename) and to
stdout, then serves until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import click
from aiohttp import web

from audit.atomic_file import write_atomic
from sim.replica import (
    STATE_KEY,
    ReplicaConfig,
    ReplicaState,
    config_from_options,
    create_app,
    quiet_http2_probes,
    replica_options,
    run_app_on,
)

__all__ = ["Cluster", "ClusterProcess", "ClusterStartError", "start_cluster", "spawn_cluster", "replica_ids"]

_REPO_ROOT = Path(__file__).resolve().parents[1]


class ClusterStartError(RuntimeError):
    """Raised when a spawned cluster exits or does not become ready in time."""


def replica_ids(n: int, prefix: str = "replica") -> list[str]:
    """Return the replica ids of an ``n``-replica cluster: ``replica-0 … replica-{n-1}``."""
    return [f"{prefix}-{i}" for i in range(n)]


@dataclass
class Cluster:
    """N replicas running in the current event loop. ``urls[i]`` serves ``apps[i]``."""

    replica_ids: list[str]
    urls: list[str]
    apps: list[web.Application]
    runners: list[web.AppRunner] = field(repr=False)

    @property
    def states(self) -> list[ReplicaState]:
        """The live :class:`sim.replica.ReplicaState` of each replica (same order as ``urls``)."""
        return [a[STATE_KEY] for a in self.apps]

    def ready_doc(self) -> list[dict[str, str]]:
        """Return ``[{"replica_id", "url"}, …]`` (the ready-file content)."""
        return [{"replica_id": r, "url": u} for r, u in zip(self.replica_ids, self.urls)]

    async def stop(self) -> None:
        """Stop every replica (closes listeners and in-flight connections)."""
        for r in self.runners:
            await r.cleanup()
        self.runners = []


async def start_cluster(n: int, cfg_template: ReplicaConfig | None = None, host: str = "127.0.0.1",
                        base_port: int = 0) -> Cluster:
    """Start ``n`` replicas in this event loop and return the running :class:`Cluster`.

    Each replica gets ``cfg_template`` with ``replica_id = replica-i``. With
    ``base_port = 0`` every replica binds a free port; otherwise replica ``i``
    binds ``base_port + i``. Raises :class:`ValueError` for ``n < 1`` and
    :class:`OSError` if a port is taken (replicas already started are stopped).
    """
    if n < 1:
        raise ValueError("a cluster needs at least one replica")
    tmpl = cfg_template or ReplicaConfig()
    cluster = Cluster(replica_ids=replica_ids(n), urls=[], apps=[], runners=[])
    try:
        for i, rid in enumerate(cluster.replica_ids):
            app = create_app(dataclasses.replace(tmpl, replica_id=rid))
            runner, url = await run_app_on(app, host, base_port + i if base_port else 0)
            cluster.apps.append(app)
            cluster.runners.append(runner)
            cluster.urls.append(url)
    except BaseException:
        await cluster.stop()
        raise
    return cluster


def _write_ready(path: str, doc: list[dict[str, str]]) -> None:
    write_atomic(path, json.dumps(doc).encode("utf-8"), mode=0o644, fsync_dir=False)  # a readiness file


async def _serve(n: int, tmpl: ReplicaConfig, host: str, base_port: int, ready_file: str | None) -> None:
    cluster = await start_cluster(n, tmpl, host, base_port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        doc = cluster.ready_doc()
        if ready_file:
            _write_ready(ready_file, doc)
        print(json.dumps(doc), flush=True)
        await stop.wait()
    finally:
        await cluster.stop()


@click.command()
@click.option("--replicas", type=click.IntRange(min=1), default=6, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--base-port", type=click.IntRange(min=0, max=65535), default=0, show_default=True,
              help="replica i binds base-port+i; 0 = free ports")
@click.option("--ready-file", type=click.Path(dir_okay=False), default=None,
              help="write [{replica_id,url},...] here once all replicas listen")
@replica_options
def main(replicas: int, host: str, base_port: int, ready_file: str | None, **options: Any) -> None:
    """Run a cluster of simulated replicas in one process until SIGINT/SIGTERM."""
    tmpl = config_from_options("replica-0", options)
    quiet_http2_probes()
    asyncio.run(_serve(replicas, tmpl, host, base_port, ready_file))


class ClusterProcess:
    """A ``python -m sim.cluster`` subprocess; context manager that waits for readiness.

    ``replicas`` is the ready-file document, ``urls`` its URLs. ``stop()``
    sends SIGTERM, then SIGKILL after ``kill_after_s`` seconds.
    """

    def __init__(self, proc: subprocess.Popen[bytes], ready_file: str, tmpdir: tempfile.TemporaryDirectory[str]) -> None:
        self.proc = proc
        self.ready_file = ready_file
        self._tmpdir = tmpdir
        self.replicas: list[dict[str, str]] = []

    @property
    def urls(self) -> list[str]:
        """Base URLs of the replicas (``http://host:port``), in replica order."""
        return [r["url"] for r in self.replicas]

    def wait_ready(self, timeout_s: float = 20.0) -> list[dict[str, str]]:
        """Block until the ready file appears; raise :class:`ClusterStartError` on exit or timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if os.path.exists(self.ready_file):
                with open(self.ready_file, encoding="utf-8") as fh:
                    self.replicas = json.load(fh)
                return self.replicas
            rc = self.proc.poll()
            if rc is not None:
                raise ClusterStartError(f"sim.cluster exited with code {rc} before it was ready")
            time.sleep(0.02)
        raise ClusterStartError(f"sim.cluster not ready after {timeout_s} s")

    def stop(self, kill_after_s: float = 5.0) -> None:
        """Terminate the subprocess (idempotent) and remove its temp dir."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(kill_after_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._tmpdir.cleanup()

    def __enter__(self) -> ClusterProcess:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def spawn_cluster(n: int, *, host: str = "127.0.0.1", base_port: int = 0, timeout_s: float = 20.0,
                  python: str | None = None, **cfg: Any) -> ClusterProcess:
    """Start ``python -m sim.cluster`` with ``n`` replicas and wait until it is ready.

    ``cfg`` holds :class:`sim.replica.ReplicaConfig` fields (except
    ``replica_id``), e.g. ``time_scale=60, capacity_blocks=2000``. Returns a
    ready :class:`ClusterProcess` (use it as a context manager). Raises
    :class:`TypeError` for an unknown field and :class:`ClusterStartError` if
    the process dies or is not ready within ``timeout_s`` seconds.
    """
    fields = {f.name for f in dataclasses.fields(ReplicaConfig)} - {"replica_id"}
    unknown = set(cfg) - fields
    if unknown:
        raise TypeError(f"unknown replica config fields: {sorted(unknown)}")
    ReplicaConfig(**cfg)  # validate before spawning
    tmpdir = tempfile.TemporaryDirectory(prefix="pg-sim-")
    ready = os.path.join(tmpdir.name, "ready.json")
    argv = [python or sys.executable, "-P", "-m", "sim.cluster", "--replicas", str(n), "--host", host,
            "--base-port", str(base_port), "--ready-file", ready]
    for k, v in cfg.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(argv, cwd=str(_REPO_ROOT), env=env, stdout=subprocess.DEVNULL)
    cp = ClusterProcess(proc, ready, tmpdir)
    try:
        cp.wait_ready(timeout_s)
    except BaseException:
        cp.stop()
        raise
    return cp


if __name__ == "__main__":
    main()
