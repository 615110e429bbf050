"""SIGKILL a gateway process under load: every request it answered (200, body complete at the
client) has its audit event in its verified chain (issue 16; gateway/inference_asgi.py hands the
event to the audit worker before the answer's last body part; the worker outlives its SIGKILLed
parent and closes the chain on stdin EOF)."""
from __future__ import annotations

import os
import signal
from pathlib import Path

from bench.soak import verify_audit
from sim.procs import stop_process
from tests.support.kill_under_load import chain_inference_lines, kill_under_load
from tests.support.waiting import wait_for
from tests.support.workers import running

KILL_AFTER = 120  # answered requests before the SIGKILL


async def test_sigkill_under_load_loses_no_answered_request_from_the_audit_chain(
        tmp_path: Path, redis_server) -> None:
    # the gateway process only: its audit worker lives on
    gw = await kill_under_load(tmp_path, redis_server.url, lambda pid: os.kill(pid, signal.SIGKILL),
                               kill_after=KILL_AFTER)
    try:
        # the worker reads the rest of its pipe, then EOF: it closes the trail (final checkpoint) and exits
        await wait_for(lambda: not any(running(c) for c in gw.workers), timeout_s=60, what="the audit worker closed")
    finally:
        stop_process(gw.proc)
        await gw.cluster.stop()
    jsonl = gw.paths.audit_dir / "jsonl"
    code, text, unsealed = verify_audit(jsonl, gw.paths.signing_key.with_name(gw.paths.signing_key.name + ".pub"))
    assert code == 0, text
    inference = chain_inference_lines(jsonl)
    missing = [rid for rid in gw.answered if rid not in inference]
    print(f"answered {len(gw.answered)} requests before the SIGKILL; missing from the chain: {len(missing)}; "
          f"unsealed records: {unsealed}")
    assert len(gw.answered) >= KILL_AFTER and not missing, missing[:5]
