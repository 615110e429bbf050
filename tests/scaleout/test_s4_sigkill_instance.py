"""Issue 16, "SIGKILL one instance mid-run: the others go on, its load expires within the lease".

Two real gateway processes (``python -m gateway.cli serve``) share one real ``redis-server``;
tenant-a may run 2 requests at once across both (no queue: beyond that, 429 at once). Instance B
holds both slots with two slow requests when its whole process group (gateway and audit worker)
is SIGKILLed: it never releases them. Instance A keeps answering: refused 429
``concurrency_limited`` while B's slots live, then served once they expire with B's lease
(``state.lease_ttl_s``), without any restart. (The in-process variants are
tests/scaleout/test_i16_shared_limits.py::test_a_crashed_instance_leaves_no_phantom_slots and
tests/scaleout/test_s2_shared_routing.py::test_a_dead_instance_load_expires_with_its_lease.)
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import aiohttp
import redis.asyncio as aioredis
import yaml

from sim.cluster import start_cluster
from sim.demo import DemoPaths, bearer_headers, gateway_config, prepare_identity
from sim.procs import free_port, python_module_cmd, start_process, stop_process, wait_for_url
from sim.replica import ReplicaConfig
from tests.support.waiting import wait_for

PREFIX = "pgs4kill:"


async def test_a_sigkilled_instance_leaves_no_slot_behind_and_the_other_goes_on(tmp_path: Path, redis_server) -> None:
    cluster = await start_cluster(2, ReplicaConfig(time_scale=1.0, decode_s_per_token=0.05))  # 400 tokens: ~20 s
    paths = DemoPaths.under(tmp_path / "work")
    issuer = prepare_identity(paths)
    headers = bearer_headers(issuer, ["tenant-a"])("tenant-a")
    procs, bases = [], []
    for name in ("a", "b"):
        port = free_port()
        cfg = gateway_config("cache_aware", cluster.ready_doc(), ["tenant-a"], paths, listen_port=port,
                             admin_port=free_port())
        cfg["tenancy"]["tenants"][0]["max_concurrency"] = 2
        cfg["tenancy"]["state_file"] = str(paths.work / f"keystate-{name}.json")
        audit = paths.audit_dir / name
        cfg["audit"] = {"jsonl": {**cfg["audit"]["jsonl"], "dir": str(audit / "jsonl")},
                        "spill": {"dir": str(audit / "spill")}}
        cfg["flow"] = {"tenant_max_queued_requests": 0}
        cfg["state"] = {"backend": "redis", "url": redis_server.url, "key_prefix": PREFIX, "lease_ttl_s": 4.0}
        path = paths.work / f"gateway-{name}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        procs.append(start_process(f"gateway-{name}", python_module_cmd("gateway.cli", "serve", "--config", str(path)),
                                   paths.logs))
        bases.append(f"http://127.0.0.1:{port}")
    raw = aioredis.Redis.from_url(redis_server.url)
    slots = f"{PREFIX}{{t:tenant-a}}:conc"

    async def post(s: aiohttp.ClientSession, base: str, max_tokens: int = 4) -> tuple[int, str]:
        body = {"model": "sim-model", "prompt": "one instance dies " * 8, "max_tokens": max_tokens}
        async with s.post(f"{base}/v1/completions", headers=headers, json=body) as r:
            data = await r.json()
            return r.status, (data.get("error") or {}).get("code", "")

    try:
        for proc, base in zip(procs, bases):
            await wait_for_url(f"{base}/readyz", timeout_s=60, proc=proc)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
            held = [asyncio.ensure_future(post(s, bases[1], max_tokens=400)) for _ in range(2)]
            await wait_for(lambda: _count(raw, slots, 2), timeout_s=30, what="B holds both slots in Redis")
            assert await post(s, bases[0]) == (429, "concurrency_limited")  # shared: A sees B's slots
            os.killpg(procs[1].pid, signal.SIGKILL)  # B's gateway and audit worker: no release, no renewal
            for t in held:
                with contextlib.suppress(aiohttp.ClientError):
                    await t
            await wait_for(lambda: not procs[1].alive(), timeout_s=30, what="B is gone")

            async def a_serves() -> bool:
                status, code = await post(s, bases[0])
                assert status == 200 or (status, code) == (429, "concurrency_limited"), (status, code)
                return status == 200

            # B's slots expire within its lease (4 s); A is never restarted and serves again
            await wait_for(a_serves, timeout_s=30, what="A serves once B's slots expired")
            assert procs[0].alive()
            results = await asyncio.gather(*(post(s, bases[0]) for _ in range(2)))
            assert results == [(200, "")] * 2  # both slots are A's again
        await wait_for(lambda: _count(raw, slots, 0), timeout_s=30, what="no slot left in Redis")
    finally:
        await raw.aclose()
        for proc in procs:
            stop_process(proc, timeout_s=20)
        await cluster.stop()


async def _count(raw: aioredis.Redis, key: str, want: int) -> bool:
    now_ms = int((await raw.time())[0]) * 1000
    return int(await raw.zcount(key, now_ms, "+inf")) == want
