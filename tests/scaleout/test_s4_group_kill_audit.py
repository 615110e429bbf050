"""SIGKILL a gateway's whole process group (gateway AND its audit worker, as a container or
systemd kill does) under load, then start the gateway again: every request answered before the
kill (200, body complete at the client) has its audit event in the verified chain (issue 16;
audit/spool.py: the gateway appends each frame it hands to the worker to a spool segment in the
page cache, and the next start's worker emits what the chain lacks). Before the spool, the
worker's unread pipe and unwritten batches died with it (bench.scaleout: 64 of 65 events)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import aiohttp
import yaml

from audit.jsonl import list_log_files
from bench.soak import verify_audit
from sim.cluster import start_cluster
from sim.demo import DemoPaths, bearer_headers, gateway_config, prepare_identity
from sim.procs import free_port, python_module_cmd, start_process, stop_process, wait_for_url
from sim.replica import ReplicaConfig
from tests.support.waiting import wait_for
from tests.support.workers import children, running

CLIENTS = 12
KILL_AFTER = 120  # answered requests before the SIGKILL


async def test_a_group_kill_under_load_loses_no_answered_request_once_the_gateway_restarts(
        tmp_path: Path, redis_server) -> None:
    cluster = await start_cluster(2, ReplicaConfig(time_scale=200.0))
    paths = DemoPaths.under(tmp_path / "work")
    issuer = prepare_identity(paths)
    headers = bearer_headers(issuer, ["tenant-a"])("tenant-a")
    port = free_port()
    cfg = gateway_config("cache_aware", cluster.ready_doc(), ["tenant-a"], paths, listen_port=port,
                         admin_port=free_port())
    cfg["state"] = {"backend": "redis", "url": redis_server.url, "key_prefix": "pgkill:"}
    cfg_path = paths.work / "gateway.yaml"
    cfg_path.write_text(yaml.safe_dump(cfg))
    proc = start_process("gateway", python_module_cmd("gateway.cli", "serve", "--config", str(cfg_path)), paths.logs)
    base = f"http://127.0.0.1:{port}"
    answered: list[str] = []
    killed = asyncio.Event()

    async def client(n: int) -> None:
        async with aiohttp.ClientSession() as s:
            i = 0
            while not killed.is_set():
                i += 1
                body = {"model": "sim-model", "prompt": f"client {n} request {i} " * 8, "max_tokens": 8,
                        "stream": i % 2 == 0}
                try:
                    async with s.post(f"{base}/v1/completions", headers=headers, json=body) as r:
                        await r.read()  # the whole body: for a stream, up to the closing chunk
                        if r.status == 200:
                            answered.append(r.headers["X-Request-Id"])
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    if killed.is_set():
                        return
                    raise

    try:
        await wait_for_url(f"{base}/readyz", timeout_s=60, proc=proc)
        await wait_for(lambda: children(proc.pid), timeout_s=30, what="the audit worker process")
        workers = children(proc.pid)
        tasks = [asyncio.create_task(client(n)) for n in range(CLIENTS)]
        await wait_for(lambda: len(answered) >= KILL_AFTER or any(t.done() for t in tasks), timeout_s=120,
                       what=f"{KILL_AFTER} answered requests")
        os.killpg(proc.pid, signal.SIGKILL)  # the whole group: the gateway and its audit worker
        killed.set()
        await asyncio.gather(*tasks)
        await wait_for(lambda: not proc.alive(), timeout_s=30, what="the gateway is gone")
        await wait_for(lambda: not any(running(c) for c in workers), timeout_s=30, what="the audit worker is gone")
        # the supervisor starts the gateway again: its worker recovers the spool before "ready"
        proc = start_process("gateway2", python_module_cmd("gateway.cli", "serve", "--config", str(cfg_path)),
                             paths.logs)
        await wait_for_url(f"{base}/readyz", timeout_s=60, proc=proc)
    finally:
        stop_process(proc, timeout_s=30)  # SIGTERM: drains and seals the chain
        await cluster.stop()
    jsonl = paths.audit_dir / "jsonl"
    code, text, unsealed = verify_audit(jsonl, paths.signing_key.with_name(paths.signing_key.name + ".pub"))
    assert code == 0, text
    inference = "\n".join(line for f in list_log_files(jsonl) for line in f.read_text().splitlines()
                          if json.loads(line).get("body", {}).get("kind") == "inference")
    missing = [rid for rid in answered if rid not in inference]
    recovered = [json.loads(line)["body"]["alert"] for f in list_log_files(jsonl) for line in f.read_text().splitlines()
                 if json.loads(line).get("body", {}).get("alert", {}).get("alert_kind") == "audit_spool_recovered"]
    print(f"answered {len(answered)} requests before the group kill; missing from the chain: {len(missing)}; "
          f"recovered from the spool: {[a['recovered_events'] for a in recovered]}; unsealed records: {unsealed}")
    assert len(answered) >= KILL_AFTER and not missing, missing[:5]
    assert len(recovered) <= 1
    assert not list((jsonl / "spool").glob("seg-*"))  # recovered and closed cleanly: nothing left over
