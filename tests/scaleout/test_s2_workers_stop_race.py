"""``serve --workers 2`` stopped by SIGTERM while the parent is still starting its workers (issue 16).

The parent installed its SIGTERM handler only after it had started every
worker: a SIGTERM that arrived in between (the first worker forked, the
second not yet) killed the parent with the default action (exit -15, the
flaky failure of test_s2_workers.py::test_sigterm_while_the_workers_are_still_starting_stops_them_cleanly
under load) and left the started worker running on the inherited sockets.
Here the signal is sent the moment the first worker process exists, which
lands in that window every time: the parent must exit 0 and no worker may
outlive it.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import yaml

from sim.cluster import start_cluster
from sim.demo import DemoPaths, gateway_config, prepare_identity
from sim.procs import free_port, python_module_cmd, start_process, stop_process
from sim.replica import ReplicaConfig
from tests.support.waiting import wait_for


def _children(pid: int) -> list[int]:
    try:
        return [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def test_sigterm_as_the_first_worker_starts_stops_the_parent_cleanly_and_leaves_no_worker(
        tmp_path: Path, redis_server) -> None:
    cluster = await start_cluster(1, ReplicaConfig(time_scale=100.0))
    paths = DemoPaths.under(tmp_path / "work")
    prepare_identity(paths)
    cfg = gateway_config("cache_aware", cluster.ready_doc(), ["tenant-a"], paths, listen_port=free_port(),
                         admin_port=free_port())
    cfg["state"] = {"backend": "redis", "url": redis_server.url, "key_prefix": "pgw3:"}
    cfg_path = paths.work / "gateway.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    proc = start_process("gateway", python_module_cmd("gateway.cli", "serve", "--config", str(cfg_path),
                                                      "--workers", "2"), paths.logs)
    seen: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not seen and proc.alive() and time.monotonic() < deadline:  # no sleep: hit the start window
            seen = _children(proc.pid)
        assert seen, proc.log_tail()
        os.kill(proc.pid, signal.SIGTERM)
        await wait_for(lambda: not proc.alive(), timeout_s=60, what="parent exits after SIGTERM")
        assert proc.popen.returncode == 0, proc.log_tail()
        await wait_for(lambda: not any(_running(p) for p in seen), timeout_s=30, what="no worker left running")
    finally:
        stop_process(proc)
        for pid in seen:  # an orphaned worker (the bug) must not outlive the test
            if _running(pid):
                os.kill(pid, signal.SIGKILL)
        await cluster.stop()
