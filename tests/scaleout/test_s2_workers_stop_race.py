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

from sim.procs import stop_process
from tests.support.waiting import wait_for
from tests.support.workers import children, running, start_workers_gateway


async def test_sigterm_as_the_first_worker_starts_stops_the_parent_cleanly_and_leaves_no_worker(
        tmp_path: Path, redis_server) -> None:
    gw = await start_workers_gateway(tmp_path, redis_server.url, "pgw3:")
    cluster, proc = gw.cluster, gw.proc
    seen: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while not seen and proc.alive() and time.monotonic() < deadline:  # no sleep: hit the start window
            seen = children(proc.pid)
        assert seen, proc.log_tail()
        os.kill(proc.pid, signal.SIGTERM)
        await wait_for(lambda: not proc.alive(), timeout_s=60, what="parent exits after SIGTERM")
        assert proc.popen.returncode == 0, proc.log_tail()
        await wait_for(lambda: not any(running(p) for p in seen), timeout_s=30, what="no worker left running")
    finally:
        stop_process(proc)
        for pid in seen:  # an orphaned worker (the bug) must not outlive the test
            if running(pid):
                os.kill(pid, signal.SIGKILL)
        await cluster.stop()
