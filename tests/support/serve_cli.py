"""``prefixgate serve`` as a real CLI child process for the quickstart tests.

:func:`quickstart_ports` picks free loopback ports for ``init_gateway_dir``;
:func:`start_replicas_and_gateway` starts ``prefixgate-sim replicas`` and
``prefixgate serve`` on an init config, each logging to a file; :func:`wait_logged`
polls a condition while the process lives; :func:`stop` ends processes with SIGTERM.
:func:`ready_quickstart` does all of it: init, start, wait for both to log ready, stop.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sim.quickstart import init_gateway_dir

__all__ = ["ENV", "ROOT", "QuickstartRun", "quickstart_ports", "ready_quickstart", "start_replicas_and_gateway", "stop", "wait_logged"]

ROOT = Path(__file__).resolve().parents[2]
#: The environment of a child process: this tree first on ``PYTHONPATH``.
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def quickstart_ports() -> tuple[int, int, int]:
    """(public port, admin port, replica base port): three distinct free ephemeral loopback
    ports, the base port and base + 1 both different from the public and admin ports."""
    port, admin_port, base = _free_ports(3)
    while base + 1 in (port, admin_port):
        port, admin_port, base = _free_ports(3)
    return port, admin_port, base


def start_replicas_and_gateway(config: Path, cwd: Path) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes],
                                                                  Path, Path]:
    """Start ``python -m sim.cli replicas`` and ``python -m gateway.cli serve`` on ``config`` in
    ``cwd``; returns at once with (replicas, gateway, replicas log, gateway log), the logs
    ``cwd/replicas.log`` and ``cwd/serve.log`` (stdout and stderr). Stop both with :func:`stop`."""
    rlog, glog = cwd / "replicas.log", cwd / "serve.log"
    with open(rlog, "wb") as rout, open(glog, "wb") as gout:
        replicas = subprocess.Popen([sys.executable, "-m", "sim.cli", "replicas", "--config", str(config)],
                                    cwd=str(cwd), env=ENV, stdout=rout, stderr=subprocess.STDOUT)
        gw = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config", str(config)],
                              cwd=str(cwd), env=ENV, stdout=gout, stderr=subprocess.STDOUT)
    return replicas, gw, rlog, glog


def wait_logged(cond: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], log: Path,
                timeout_s: float = 60) -> None:
    """Poll ``cond()`` every 0.05 s until it is true. Raises AssertionError naming ``what``, with
    ``log``'s text, when ``proc`` exits first or ``timeout_s`` seconds (monotonic) pass."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"{what}: process exited {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s:\n{log.read_text()}")


def stop(*procs: subprocess.Popen[bytes]) -> None:
    """SIGTERM each process still running and wait up to 30 s for it, else kill it."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


@dataclass
class QuickstartRun:
    """A running quickstart: the public and admin ports, the replicas and gateway processes and
    the gateway's log file (stdout and stderr)."""

    port: int
    admin_port: int
    replicas: subprocess.Popen[bytes]
    gw: subprocess.Popen[bytes]
    glog: Path


@contextlib.contextmanager
def ready_quickstart(tmp: Path) -> Iterator[QuickstartRun]:
    """``init_gateway_dir(tmp/"gw")`` (one replica, free ports), then replicas and ``serve`` as
    :func:`start_replicas_and_gateway` in ``tmp``; yields once the replicas logged ``replicas ready``
    and the gateway ``ready: `` (each within 60 s, else AssertionError with the log). Stops both
    processes (:func:`stop`) on exit, whether or not the test stopped the gateway itself."""
    port, admin_port, base = quickstart_ports()
    res = init_gateway_dir(tmp / "gw", port=port, admin_port=admin_port, replicas=1, replica_base_port=base)
    replicas, gw, rlog, glog = start_replicas_and_gateway(res.config, tmp)
    try:
        wait_logged(lambda: "replicas ready" in rlog.read_text(), "replicas", replicas, rlog)
        wait_logged(lambda: "ready: " in glog.read_text(), "gateway ready", gw, glog)
        yield QuickstartRun(port, admin_port, replicas, gw, glog)
    finally:
        stop(gw, replicas)
