"""Issue 13: ``prefixgate serve`` says where it listens, what it runs and when it is ready,
drains and exits (before the fix it printed nothing at all).

Runs the real CLI in a subprocess on a ``prefixgate-sim init`` config, in
front of ``prefixgate-sim replicas``, then sends SIGTERM.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from sim.quickstart import init_gateway_dir

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond: Callable[[], bool], what: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"{what}: process exited {proc.returncode}:\n{log.read_text()}")
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout_s} s:\n{log.read_text()}")


def test_serve_logs_listeners_summary_ready_drain_and_exit(tmp_path: Path) -> None:
    port, admin_port = _free_port(), _free_port()
    base = _free_port()
    while base + 1 in (port, admin_port) or base in (port, admin_port):
        base = _free_port()
    res = init_gateway_dir(tmp_path / "gw", port=port, admin_port=admin_port, replicas=1, replica_base_port=base)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    rlog, glog = tmp_path / "replicas.log", tmp_path / "serve.log"
    with open(rlog, "wb") as rout, open(glog, "wb") as gout:
        replicas = subprocess.Popen([sys.executable, "-m", "sim.cli", "replicas", "--config", str(res.config)],
                                    cwd=str(tmp_path), env=env, stdout=rout, stderr=subprocess.STDOUT)
        gw = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--config", str(res.config)],
                              cwd=str(tmp_path), env=env, stdout=gout, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: "replicas ready" in rlog.read_text(), "replicas", replicas, rlog)
        _wait(lambda: "ready: " in glog.read_text(), "gateway ready", gw, glog)
        text = glog.read_text()
        assert f"listening: public http://127.0.0.1:{port}" in text, text
        assert f"listening: admin http://127.0.0.1:{admin_port}" in text, text
        from rego import policy_dir

        ready = re.search(r"ready: policy (\w+) \(dir (.+?)\), (\d+) tenants, (\d+) trust domains, (\d+) replicas", text)
        assert ready, text
        assert ready.groups() == ("embedded", str(policy_dir()), "2", "1", "1")
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
        gw.send_signal(signal.SIGTERM)
        assert gw.wait(timeout=60) == 0
        text = glog.read_text()
        assert "draining: listeners closed" in text and "stopped: audit flushed, exiting" in text, text
        assert text.index("ready: ") < text.index("draining: ") < text.index("stopped: ")
    finally:
        for p in (gw, replicas):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
