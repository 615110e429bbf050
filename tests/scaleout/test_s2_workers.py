"""``prefixgate serve --workers 2``: two real gateway processes on one pair of listening sockets,
sharing one tenant's limits through a real redis-server (gateway/workers.py, issue 16).

Each request goes on a new connection, so the kernel hands it to either worker.
A tenant with a burst of 10 (no refill during the test) gets exactly 10 of 30
requests through both workers (each worker with its own in-process bucket
would admit up to 20). SIGTERM to the parent stops both workers cleanly; each
wrote its own audit chain, which verifies, with its instance id on every event.
"""
from __future__ import annotations

import json
import os
import signal
import socket
from pathlib import Path

import aiohttp

from audit.jsonl import list_log_files
from bench.soak import verify_audit
from sim.demo import bearer_headers
from sim.procs import stop_process, wait_for_url
from tests.support.waiting import wait_for
from tests.support.workers import children, running, start_workers_gateway


async def test_two_workers_share_the_port_the_limits_and_keep_their_own_audit_chains(
        tmp_path: Path, redis_server) -> None:
    gw = await start_workers_gateway(tmp_path, redis_server.url, "pgw:", replicas=2,
                                     tenant={"rate_rps": 0.001, "rate_burst": 10})
    cluster, paths, proc, base = gw.cluster, gw.paths, gw.proc, gw.base
    headers = bearer_headers(gw.issuer, ["tenant-a"])("tenant-a")
    try:
        await wait_for_url(f"{base}/readyz", timeout_s=60, proc=proc)
        await wait_for(lambda: len(children(proc.pid)) == 2, timeout_s=30, what="two worker processes")
        await wait_for(lambda: proc.log_path.read_text().count("prefixgate: ready:") == 2, timeout_s=60,
                       what="both workers ready")
        workers = children(proc.pid)
        statuses = []
        for i in range(30):  # a new connection each time: either worker may accept it
            async with aiohttp.ClientSession() as s:
                async with s.post(f"{base}/v1/completions", headers=headers,
                                  json={"model": "sim-model", "prompt": f"worker test {i}", "max_tokens": 4}) as r:
                    statuses.append(r.status)
        assert statuses.count(200) == 10 and statuses.count(429) == 20, statuses
        os.kill(proc.pid, signal.SIGTERM)
        await wait_for(lambda: not proc.alive(), timeout_s=60, what="parent exits after SIGTERM")
        assert proc.popen.returncode == 0, proc.log_tail()
        assert not any(running(w) for w in workers)
    finally:
        stop_process(proc)
        await cluster.stop()
    # one audit chain per worker, each verifies, every event names its worker
    host = socket.gethostname()
    seen = 0
    for i in range(2):
        jsonl = paths.audit_dir / "jsonl" / f"worker-{i}"
        code, text, unsealed = verify_audit(jsonl, paths.signing_key.with_name(paths.signing_key.name + ".pub"))
        assert code == 0 and unsealed == 0, text
        bodies = [json.loads(line).get("body", {}) for f in list_log_files(jsonl) for line in f.read_text().splitlines()]
        events = [b for b in bodies if "kind" in b]
        assert {e.get("instance") for e in events} <= {f"{host}/w{i}"}, events[:2]
        seen += sum(e["kind"] == "inference" and e["outcome"] == "allowed" for e in events)
    assert seen == 10  # every admitted request audited by the worker that served it (refusals may be summarised)


async def test_sigterm_while_the_workers_are_still_starting_stops_them_cleanly(tmp_path: Path, redis_server) -> None:
    # before the fix a worker that got SIGTERM before its event loop's handlers died of it
    # (exit -15) and the parent exited 1
    gw = await start_workers_gateway(tmp_path, redis_server.url, "pgw2:")
    cluster, paths, proc = gw.cluster, gw.paths, gw.proc
    try:
        await wait_for(lambda: len(children(proc.pid)) == 2, timeout_s=30, what="two worker processes")
        os.kill(proc.pid, signal.SIGTERM)
        await wait_for(lambda: not proc.alive(), timeout_s=60, what="parent exits after SIGTERM")
        assert proc.popen.returncode == 0, proc.log_tail()
    finally:
        stop_process(proc)
        await cluster.stop()
    for i in range(2):  # a worker that had opened its chain sealed it
        jsonl = paths.audit_dir / "jsonl" / f"worker-{i}"
        if list_log_files(jsonl) if jsonl.exists() else []:
            code, text, unsealed = verify_audit(jsonl, paths.signing_key.with_name(paths.signing_key.name + ".pub"))
            assert code == 0 and unsealed == 0, text
