"""SIGKILL a gateway's whole process group (gateway AND its audit worker, as a container or
systemd kill does) under load, then start the gateway again: every request answered before the
kill (200, body complete at the client) has its audit event in the verified chain (issue 16;
audit/spool.py: the gateway appends each frame it hands to the worker to a spool segment in the
page cache, and the next start's worker emits what the chain lacks). Before the spool, the
worker's unread pipe and unwritten batches died with it (bench.scaleout: 64 of 65 events)."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from audit.jsonl import list_log_files
from bench.soak import verify_audit
from sim.procs import python_module_cmd, start_process, stop_process, wait_for_url
from tests.support.kill_under_load import chain_inference_lines, kill_under_load
from tests.support.waiting import wait_for
from tests.support.workers import running

KILL_AFTER = 120  # answered requests before the SIGKILL


async def test_a_group_kill_under_load_loses_no_answered_request_once_the_gateway_restarts(
        tmp_path: Path, redis_server) -> None:
    # the whole group: the gateway and its audit worker
    gw = await kill_under_load(tmp_path, redis_server.url, lambda pid: os.killpg(pid, signal.SIGKILL),
                               kill_after=KILL_AFTER)
    proc = gw.proc
    try:
        await wait_for(lambda: not any(running(c) for c in gw.workers), timeout_s=30, what="the audit worker is gone")
        # the supervisor starts the gateway again: its worker recovers the spool before "ready"
        proc = start_process("gateway2", python_module_cmd("gateway.cli", "serve", "--config", str(gw.cfg_path)),
                             gw.paths.logs)
        await wait_for_url(f"{gw.base}/readyz", timeout_s=60, proc=proc)
    finally:
        stop_process(proc, timeout_s=30)  # SIGTERM: drains and seals the chain
        await gw.cluster.stop()
    jsonl = gw.paths.audit_dir / "jsonl"
    code, text, unsealed = verify_audit(jsonl, gw.paths.signing_key.with_name(gw.paths.signing_key.name + ".pub"))
    assert code == 0, text
    inference = chain_inference_lines(jsonl)
    missing = [rid for rid in gw.answered if rid not in inference]
    recovered = [json.loads(line)["body"]["alert"] for f in list_log_files(jsonl) for line in f.read_text().splitlines()
                 if json.loads(line).get("body", {}).get("alert", {}).get("alert_kind") == "audit_spool_recovered"]
    print(f"answered {len(gw.answered)} requests before the group kill; missing from the chain: {len(missing)}; "
          f"recovered from the spool: {[a['recovered_events'] for a in recovered]}; unsealed records: {unsealed}")
    assert len(gw.answered) >= KILL_AFTER and not missing, missing[:5]
    assert len(recovered) <= 1
    assert not list((jsonl / "spool").glob("seg-*"))  # recovered and closed cleanly: nothing left over
