"""SIGKILL a gateway process under load: every request it answered (200, body complete at the
client) has its audit event in its verified chain (issue 16; gateway/inference_asgi.py hands the
event to the audit worker before the answer's last body part; the worker outlives its SIGKILLed
parent and closes the chain on stdin EOF)."""
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


async def test_sigkill_under_load_loses_no_answered_request_from_the_audit_chain(
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
        os.kill(proc.pid, signal.SIGKILL)  # the gateway process only: its audit worker lives on
        killed.set()
        await asyncio.gather(*tasks)
        await wait_for(lambda: not proc.alive(), timeout_s=30, what="the gateway is gone")
        # the worker reads the rest of its pipe, then EOF: it closes the trail (final checkpoint) and exits
        await wait_for(lambda: not any(running(c) for c in workers), timeout_s=60, what="the audit worker closed")
    finally:
        stop_process(proc)
        await cluster.stop()
    jsonl = paths.audit_dir / "jsonl"
    code, text, unsealed = verify_audit(jsonl, paths.signing_key.with_name(paths.signing_key.name + ".pub"))
    assert code == 0, text
    inference = "\n".join(line for f in list_log_files(jsonl) for line in f.read_text().splitlines()
                          if json.loads(line).get("body", {}).get("kind") == "inference")
    missing = [rid for rid in answered if rid not in inference]
    print(f"answered {len(answered)} requests before the SIGKILL; missing from the chain: {len(missing)}; "
          f"unsealed records: {unsealed}")
    assert len(answered) >= KILL_AFTER and not missing, missing[:5]
