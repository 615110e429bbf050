"""Graceful shutdown of the real gateway process (``python -m gateway.cli serve``).

SIGTERM while streams are in flight: the listener stops accepting new
connections at once, every in-flight stream completes (drain), the process
exits 0, and the audit log's final record is a signed checkpoint that seals
every event (``prefixgate audit verify`` passes with no unsealed record).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
from bench.soak import count_audit_events, verify_audit
from sim.cluster import start_cluster
from sim.demo import DemoPaths, bearer_headers, gateway_config, prepare_identity, start_gateway
from sim.procs import free_port, stop_process
from sim.replica import ReplicaConfig

N_STREAMS = 6
OUT_TOKENS = 30
TENANTS = ["tenant-a", "tenant-b"]


async def _stream(session: aiohttp.ClientSession, base: str, headers: dict[str, str], i: int,
                  first: asyncio.Event) -> dict[str, Any]:
    body = {"model": "sim-model", "prompt": " ".join(f"s{i}w{j}" for j in range(64)), "max_tokens": OUT_TOKENS,
            "stream": True, "stream_options": {"include_usage": True}}
    out: dict[str, Any] = {"done": False, "usage": None, "error": None, "chunks": 0}
    async with session.post(f"{base}/v1/completions", json=body, headers=headers) as resp:
        out["status"] = resp.status
        out["request_id"] = resp.headers.get("X-Request-Id")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            first.set()
            if data == b"[DONE]":
                out["done"] = True
                continue
            ev = json.loads(data)
            if "error" in ev:
                out["error"] = ev["error"]
            if ev.get("usage"):
                out["usage"] = ev["usage"]
            out["chunks"] += 1
    out["ended"] = time.monotonic()
    return out


def _refuses(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return False
    except OSError:
        return True


async def test_sigterm_drains_streams_and_seals_audit(tmp_path: Path):
    # slow decode: each stream runs ~4.5 s (30 tokens x 0.15 s), long enough to be in flight at SIGTERM
    cluster = await start_cluster(2, ReplicaConfig(time_scale=1.0, decode_s_per_token=0.15, stream_chunk_tokens=1,
                                                   prefill_tokens_per_s=1e6))
    paths = DemoPaths.under(tmp_path / "work")
    issuer = prepare_identity(paths)
    headers_for = bearer_headers(issuer, TENANTS)
    cfg = gateway_config("cache_aware", cluster.ready_doc(), TENANTS, paths, listen_port=free_port(),
                         admin_port=free_port())
    gw = None
    try:
        gw, base = await start_gateway("gateway", cfg, paths)
        port = cfg["listen"]["port"]
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=40)) as session:
            async with session.get(f"{base}/healthz") as r:  # leaves an idle keep-alive connection behind
                assert r.status == 200
            firsts = [asyncio.Event() for _ in range(N_STREAMS)]
            tasks = [asyncio.ensure_future(_stream(session, base, dict(headers_for(TENANTS[i % 2])), i, firsts[i]))
                     for i in range(N_STREAMS)]
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in firsts)), timeout=15)
            t_term = time.monotonic()
            os.kill(gw.pid, signal.SIGTERM)
            # stops accepting new connections while the streams are still running
            while not _refuses(port):
                assert time.monotonic() - t_term < 5, "listener still accepts 5 s after SIGTERM"
                await asyncio.sleep(0.05)
            assert not all(t.done() for t in tasks), "streams ended before the listener closed"
            results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=35)
        for r in results:
            assert r["status"] == 200 and r["error"] is None and r["done"], r
            assert r["usage"]["completion_tokens"] == OUT_TOKENS
        # the process exits by itself, cleanly, after the streams finished
        deadline = time.monotonic() + 35
        while gw.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not gw.alive(), "gateway did not exit after draining"
        assert gw.popen.returncode == 0, gw.log_tail()
    finally:
        if gw is not None:
            stop_process(gw)
        await cluster.stop()
    # audit: one allowed event per stream, the final record is a checkpoint sealing them, the chain verifies
    jsonl = paths.audit_dir / "jsonl"
    events, dup, last_type, checkpoints = count_audit_events(jsonl)
    assert dup == 0 and len(events) == N_STREAMS
    assert {e["request_id"] for e in events.values()} == {r["request_id"] for r in results}
    assert all(e["outcome"] == "allowed" and e["output_tokens"] == OUT_TOKENS for e in events.values())
    assert last_type == "checkpoint" and checkpoints >= 1
    code, text, unsealed = verify_audit(jsonl, paths.signing_key.with_name(paths.signing_key.name + ".pub"))
    assert code == 0, text
    assert unsealed == 0
    assert "Traceback" not in gw.log_tail(20000)


async def test_idle_gateway_exits_on_sigint_with_sealed_log(tmp_path: Path):
    cluster = await start_cluster(1, ReplicaConfig(time_scale=100.0))
    paths = DemoPaths.under(tmp_path / "work")
    prepare_identity(paths)
    cfg = gateway_config("round_robin", cluster.ready_doc(), TENANTS, paths, listen_port=free_port(),
                         admin_port=free_port())
    gw = None
    try:
        gw, base = await start_gateway("gateway", cfg, paths)
        os.kill(gw.pid, signal.SIGINT)
        deadline = time.monotonic() + 20
        while gw.alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not gw.alive() and gw.popen.returncode == 0, gw.log_tail()
    finally:
        if gw is not None:
            stop_process(gw)
        await cluster.stop()
    _, _, last_type, _ = count_audit_events(paths.audit_dir / "jsonl")
    assert last_type == "checkpoint"
