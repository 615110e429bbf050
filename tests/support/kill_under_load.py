"""A real gateway process killed under load, for the SIGKILL audit tests (issue 16).

:func:`kill_under_load` starts 2 simulated replicas and ``python -m gateway.cli serve`` (demo
configuration, ``state.backend: redis``), runs closed-loop clients (plain and streamed
completions) until ``kill_after`` requests were answered (200, body complete at the client),
calls ``kill(pid)`` and returns once the clients stopped and the gateway is gone. The caller owns
the returned processes (stop them in a ``finally``). :func:`chain_inference_lines` reads the
inference events of a JSONL audit directory, to look the answered request ids up in.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from audit.jsonl import list_log_files
from sim.cluster import start_cluster
from sim.demo import DemoPaths, bearer_headers, gateway_config, prepare_identity
from sim.procs import free_port, python_module_cmd, start_process, stop_process, wait_for_url
from sim.replica import ReplicaConfig
from tests.support.waiting import wait_for
from tests.support.workers import children

__all__ = ["KilledGateway", "kill_under_load", "chain_inference_lines"]


@dataclass
class KilledGateway:
    """What :func:`kill_under_load` leaves: the killed gateway ``proc`` (a ``ManagedProcess``), its
    ``cfg_path`` and ``base`` URL (to start it again), ``paths``, the ``cluster`` of replicas, the
    ``answered`` request ids (``X-Request-Id`` of each 200 read to its end) and the pids of its
    audit ``workers`` at the kill."""

    proc: Any
    cfg_path: Path
    base: str
    paths: DemoPaths
    cluster: Any
    answered: list[str]
    workers: list[int]


async def kill_under_load(tmp_path: Path, redis_url: str, kill: Callable[[int], None], *,
                          clients: int = 12, kill_after: int = 120) -> KilledGateway:
    """Start a gateway under ``clients`` closed-loop clients, ``kill(pid)`` it after ``kill_after``
    answers; raises ``TimeoutError`` (from :func:`wait_for`) when it does not get there, after
    stopping what it started."""
    cluster = await start_cluster(2, ReplicaConfig(time_scale=200.0))
    paths = DemoPaths.under(tmp_path / "work")
    issuer = prepare_identity(paths)
    headers = bearer_headers(issuer, ["tenant-a"])("tenant-a")
    port = free_port()
    cfg = gateway_config("cache_aware", cluster.ready_doc(), ["tenant-a"], paths, listen_port=port,
                         admin_port=free_port())
    cfg["state"] = {"backend": "redis", "url": redis_url, "key_prefix": "pgkill:"}
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
        tasks = [asyncio.create_task(client(n)) for n in range(clients)]
        await wait_for(lambda: len(answered) >= kill_after or any(t.done() for t in tasks), timeout_s=120,
                       what=f"{kill_after} answered requests")
        kill(proc.pid)
        killed.set()
        await asyncio.gather(*tasks)
        await wait_for(lambda: not proc.alive(), timeout_s=30, what="the gateway is gone")
    except BaseException:
        stop_process(proc)
        await cluster.stop()
        raise
    return KilledGateway(proc, cfg_path, base, paths, cluster, answered, workers)


def chain_inference_lines(jsonl: Path) -> str:
    """The JSONL audit lines of kind ``inference`` under ``jsonl``, joined by newlines."""
    return "\n".join(line for f in list_log_files(jsonl) for line in f.read_text().splitlines()
                     if json.loads(line).get("body", {}).get("kind") == "inference")
