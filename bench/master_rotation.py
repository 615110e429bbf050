"""Master rotation across three real gateway processes sharing one real redis-server (issue 16; not a test).

``python -m bench.master_rotation [--rotations 3] [--name master_rotation]``. Each
instance (``python -m gateway.cli serve``, ``state.backend: redis``) has its OWN
master-secret file and state file; two simulated replicas answer at once and a
light load (one client, round robin, ~5 ms apart) runs throughout. Per
rotation: a new secret is written to the three files (out of band, as a
secret manager would), then ``POST /admin/keys/rotate-master`` on instance 1;
the delay from its answer until instances 2 and 3 have written the new
``master_generation`` to their state files (which ``KeyRing.adopt_master``
writes before it uses the new master) is polled every 2 ms. At the end each
instance's ``prefixgate_master_generation`` and
``prefixgate_shared_key_records_rejected`` are read from ``/admin/metrics`` (as an
operator: operators-only since R3-5) and every
answer's status is counted. Writes ``bench/results/<name>.json``.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.scaleout import OPERATOR
from sim.click_options import ClickOptions
from sim.redis_server import REDIS_SERVER, RedisServer
from sim.demo import (
    ClusterSpec,
    DemoPaths,
    bearer_headers,
    gateway_config,
    prepare_identity,
    start_cluster_proc,
    start_gateway,
)
from sim.procs import free_port, stop_process

RESULTS = Path(__file__).resolve().parent / "results"


def _generation(state_file: Path) -> int:
    try:
        return int(json.loads(state_file.read_text()).get("master_generation", 1))
    except (OSError, ValueError):
        return 0


def _provision(path: Path, secret: str) -> None:
    """Write ``secret`` to ``path`` atomically with mode 0600 (what the secret manager does)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(secret)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


async def run(rotations: int) -> dict[str, Any]:
    """Start Redis, replicas and three gateways; rotate ``rotations`` times; return the figures."""
    work = Path(tempfile.mkdtemp(prefix="pg-master-rotation-"))
    (work / "redis").mkdir()
    redis = RedisServer(REDIS_SERVER, work / "redis")
    redis.start()
    paths = DemoPaths.under(work / "demo")
    issuer = prepare_identity(paths)
    cluster, replicas = await start_cluster_proc(ClusterSpec(replicas=2, time_scale=1e6, decode_s_per_token=0.0),
                                                 paths)
    insts: list[tuple[Any, str, str, Path, Path]] = []
    try:
        first = secrets.token_hex(32)
        for i in range(3):
            own = work / f"inst{i}"
            own.mkdir()
            key = own / "master.key"
            _provision(key, first)
            cfg = gateway_config("cache_aware", replicas, ["tenant-a"], paths, listen_port=free_port(),
                                 admin_port=free_port())
            cfg["tenancy"].update(master_secret_file=str(key), master_secret_env=None,
                                  state_file=str(own / "keystate.json"), operators=[OPERATOR])
            cfg["audit"]["jsonl"]["dir"] = str(own / "audit")
            cfg["audit"]["ocsf"]["file"] = str(own / "ocsf.jsonl")
            cfg["audit"]["spill"]["dir"] = str(own / "spill")
            cfg["state"] = {"backend": "redis", "url": redis.url, "key_prefix": "pgm:"}
            proc, base = await start_gateway(f"gw{i}", cfg, paths, timeout_s=90)
            insts.append((proc, base, f"http://127.0.0.1:{cfg['admin']['port']}", own / "keystate.json", key))
        headers = bearer_headers(issuer, ["tenant-a"])("tenant-a")
        token = issuer.mint(OPERATOR, "prefixgate-admin", 600)
        stop = asyncio.Event()
        statuses: list[int] = []

        async def load() -> None:
            async with aiohttp.ClientSession() as s:
                n = 0
                while not stop.is_set():
                    n += 1
                    async with s.post(insts[n % 3][1] + "/v1/completions", headers=headers,
                                      json={"model": "sim-model", "prompt": f"p {n} " * 20, "max_tokens": 1}) as r:
                        await r.read()
                        statuses.append(r.status)
                    await asyncio.sleep(0.005)

        loader = asyncio.create_task(load())
        out = []
        async with aiohttp.ClientSession() as http:
            for _ in range(rotations):
                await asyncio.sleep(1.0)
                new = secrets.token_hex(32)
                for inst in insts:
                    _provision(inst[4], new)
                t_sent = time.monotonic()
                async with http.post(insts[0][2] + "/admin/keys/rotate-master",
                                     headers={"Authorization": f"Bearer {token}"}) as resp:
                    status, body = resp.status, await resp.json()
                t_answer = time.monotonic()
                seen: dict[int, float] = {}
                while len(seen) < 2 and time.monotonic() - t_answer < 10:
                    for k in (1, 2):
                        if k not in seen and _generation(insts[k][3]) >= body.get("master_generation", 0):
                            seen[k] = time.monotonic()
                    await asyncio.sleep(0.002)
                out.append({"generation": body.get("master_generation"), "admin_status": status,
                            "admin_call_ms": round((t_answer - t_sent) * 1000, 1),
                            "seen_after_answer_ms": {f"instance{k + 1}": round((t - t_answer) * 1000, 1)
                                                     for k, t in sorted(seen.items())},
                            "not_seen_within_10s": [k + 1 for k in (1, 2) if k not in seen]})
        stop.set()
        await loader
        metrics = {}
        async with aiohttp.ClientSession() as s:
            for i, inst in enumerate(insts):
                text = await (await s.get(inst[2] + "/admin/metrics",
                                          headers={"Authorization": f"Bearer {token}"})).text()
                metrics[f"instance{i + 1}"] = [line for line in text.splitlines() if line.startswith(
                    ("prefixgate_master_generation ", "prefixgate_shared_key_records_rejected ",
                     "prefixgate_shared_master_generation_pending "))]
        return {"rotations": out, "requests": len(statuses), "non_200": sum(1 for x in statuses if x != 200),
                "metrics_at_end": metrics}
    finally:
        for inst in insts:
            stop_process(inst[0])
        stop_process(cluster)
        redis.stop()


def main() -> None:
    """``python -m bench.master_rotation``: run and write ``bench/results/<name>.json``."""
    ap = ClickOptions(prog="python -m bench.master_rotation", description=__doc__.split("\n")[0])
    ap.option("--rotations", type=int, default=3)
    ap.option("--name", default="master_rotation")
    args = ap.parse()
    doc = asyncio.run(run(args.rotations))
    doc["meta"] = {"run_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    (RESULTS / f"{args.name}.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
