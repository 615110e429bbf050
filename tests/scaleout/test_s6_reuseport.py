"""``serve --workers 2`` gives each worker its own ``SO_REUSEPORT`` public listener (gateway/workers.py).

With one shared listening socket the first worker awake could accept nearly
every connection a load generator opened at once (2 of 10 wrk runs measured
one worker, notes/s6-workers.md). Now the parent binds one public socket per
worker with ``SO_REUSEPORT`` and the kernel hashes connections across them.
These tests check: each worker listens on its own socket (a different socket
inode per worker, none shared), 32 connections opened at once reach both
workers (each worker's audit chain names the requests it served), and the
port is still exclusive: a plain bind fails and a second ``serve`` (1 or 2
workers) refuses to start while the gateway runs.
"""
from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest

from audit.jsonl import list_log_files
from gateway.server import bind_listener
from sim.demo import bearer_headers
from sim.procs import stop_process, wait_for_url
from tests.support.waiting import wait_for
from tests.support.workers import children, start_workers_gateway

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-worker listeners are Linux only")


def listening_inodes(port: int) -> set[int]:
    """Socket inodes of the TCP sockets in LISTEN on ``port`` (IPv4 and IPv6, from /proc/net)."""
    found: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if int(cols[1].rsplit(":", 1)[1], 16) == port and cols[3] == "0A":
                found.add(int(cols[9]))
    return found


def socket_inodes(pid: int) -> set[int]:
    """Inodes of the sockets process ``pid`` holds open."""
    out: set[int] = set()
    fd_dir = Path(f"/proc/{pid}/fd")
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            out.add(int(target[8:-1]))
    return out


def served_per_worker(audit_dir: Path) -> list[int]:
    """Allowed inference events in each worker's audit chain (worker 0 first)."""
    counts = []
    for i in range(2):
        jsonl = audit_dir / "jsonl" / f"worker-{i}"
        bodies = [json.loads(line).get("body", {}) for f in list_log_files(jsonl) for line in f.read_text().splitlines()]
        counts.append(sum(b.get("kind") == "inference" and b.get("outcome") == "allowed" for b in bodies))
    return counts


def second_serve(cfg_path: Path, workers: int) -> subprocess.CompletedProcess[str]:
    """Run another ``serve`` on the same configuration (same ports); it should exit at once."""
    return subprocess.run([sys.executable, "-m", "gateway.cli", "serve", "--config", str(cfg_path),
                           "--workers", str(workers)], capture_output=True, text=True, timeout=120,
                          env={**os.environ}, check=False)


async def test_each_worker_has_its_own_listener_both_get_connections_and_the_port_stays_exclusive(
        tmp_path: Path, redis_server) -> None:
    gw = await start_workers_gateway(tmp_path, redis_server.url, "pgwrp:",
                                     tenant={"rate_rps": 1000, "rate_burst": 1000})
    proc, base = gw.proc, gw.base
    headers = bearer_headers(gw.issuer, ["tenant-a"])("tenant-a")
    try:
        await wait_for_url(f"{base}/readyz", timeout_s=60, proc=proc)
        await wait_for(lambda: len(children(proc.pid)) == 2, timeout_s=30, what="two worker processes")
        await wait_for(lambda: proc.log_path.read_text().count("prefixgate: ready:") == 2, timeout_s=60,
                       what="both workers ready")
        workers = children(proc.pid)
        # each worker holds exactly one of the public port's listening sockets, none shared
        public = listening_inodes(gw.port)
        held = [socket_inodes(pid) & public for pid in workers]
        assert [len(h) for h in held] == [1, 1], (public, held)
        assert held[0] != held[1], held
        assert not socket_inodes(proc.pid) & public  # the parent closed its copies

        # the port stays exclusive: a plain bind fails, a second gateway refuses to start
        with pytest.raises(OSError) as caught:
            bind_listener("127.0.0.1", gw.port)
        assert caught.value.errno == errno.EADDRINUSE
        for n in (1, 2):
            done = await asyncio.to_thread(second_serve, gw.paths.work / "gateway.yaml", n)
            assert done.returncode != 0, done.stderr[-2000:]
            assert "public listener (listen)" in done.stderr and "in use" in done.stderr, done.stderr[-2000:]
        assert proc.alive()

        # 32 connections opened at once: both workers serve some
        async def one(i: int) -> int:
            async with aiohttp.ClientSession() as s:  # its own connection
                async with s.post(f"{base}/v1/completions", headers=headers,
                                  json={"model": "sim-model", "prompt": f"spread {i}", "max_tokens": 2}) as r:
                    await r.read()
                    return r.status
        statuses = await asyncio.gather(*(one(i) for i in range(32)))
        assert statuses.count(200) == 32, statuses
        os.kill(proc.pid, signal.SIGTERM)
        await wait_for(lambda: not proc.alive(), timeout_s=60, what="parent exits after SIGTERM")
        assert proc.popen.returncode == 0, proc.log_tail()
    finally:
        stop_process(proc)
        await gw.cluster.stop()
    counts = served_per_worker(gw.paths.audit_dir)
    assert sum(counts) == 32 and min(counts) > 0, counts


def test_bind_worker_listeners_one_reuseport_socket_per_worker_admin_shared_and_the_setting_off() -> None:
    from gateway.config import GatewayConfig
    from gateway.workers import bind_worker_listeners

    cfg = GatewayConfig.model_validate({"listen": {"port": 0}, "admin": {"port": 0}})
    public, admin = bind_worker_listeners(cfg, 3)
    try:
        ports = {s.getsockname()[1] for s in public}
        assert len(public) == 3 and len(ports) == 1 and len(admin) == 1
        assert all(s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) for s in public)
        assert not admin[0].getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
        for port in (ports.pop(), admin[0].getsockname()[1]):  # a plain bind (the next gateway's probe) fails
            with pytest.raises(OSError) as caught:
                bind_listener("127.0.0.1", port)
            assert caught.value.errno == errno.EADDRINUSE
    finally:
        for s in public + admin:
            s.close()
    off = GatewayConfig.model_validate({"listen": {"port": 0}, "admin": None,
                                        "server": {"listener_per_worker": False}})
    public, admin = bind_worker_listeners(off, 3)
    try:
        assert len(public) == 1 and admin == []
        assert not public[0].getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
    finally:
        public[0].close()


def test_bind_worker_listeners_refuses_a_port_held_without_reuseport() -> None:
    from gateway.config import GatewayConfig
    from gateway.server import ListenerUnavailable
    from gateway.workers import bind_worker_listeners

    holder = bind_listener("127.0.0.1", 0)
    try:
        port = holder.getsockname()[1]
        cfg = GatewayConfig.model_validate({"listen": {"port": port}, "admin": None})
        with pytest.raises(ListenerUnavailable, match="public listener"):
            bind_worker_listeners(cfg, 2)
    finally:
        holder.close()
