"""Review R3-13: ``prefixgate serve`` logs ``ready:`` after the trust bundle's first
load (before the fix it came first, while ``/readyz`` still had to load the bundle).
Real CLI in a subprocess in front of ``prefixgate-sim replicas``, ephemeral ports only.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from sim.quickstart import init_gateway_dir

ROOT = Path(__file__).resolve().parents[2]
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


def _wait(cond: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"{what}: process exited {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s:\n{log.read_text()}")


def _stop(*procs: subprocess.Popen[bytes]) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def test_ready_is_logged_after_the_first_trust_bundle_load(tmp_path: Path) -> None:
    port, admin_port, base = _free_ports(3)
    while base + 1 in (port, admin_port):
        port, admin_port, base = _free_ports(3)
    res = init_gateway_dir(tmp_path / "gw", port=port, admin_port=admin_port, replicas=1, replica_base_port=base)
    rlog, glog = tmp_path / "replicas.log", tmp_path / "serve.log"
    with open(rlog, "wb") as rout, open(glog, "wb") as gout:
        replicas = subprocess.Popen([sys.executable, "-m", "sim.cli", "replicas", "--config", str(res.config)],
                                    cwd=str(tmp_path), env=ENV, stdout=rout, stderr=subprocess.STDOUT)
        gw = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config", str(res.config)],
                              cwd=str(tmp_path), env=ENV, stdout=gout, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: "replicas ready" in rlog.read_text(), "replicas", replicas, rlog)
        # nothing asks /readyz or sends a request: serve itself must load the bundle before "ready:"
        _wait(lambda: "ready: " in glog.read_text(), "gateway ready", gw, glog)
        text = glog.read_text()
        assert "bundle keys now" in text, text
        assert text.index("listening: public") < text.index("bundle keys now") < text.index("ready: "), text
        assert text.index("listening: admin") < text.index("ready: "), text
    finally:
        _stop(gw, replicas)
