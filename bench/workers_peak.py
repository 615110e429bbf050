"""Peak rate of ``prefixgate serve`` with 1 process and with ``--workers N`` (issue 16; not a test).

``python -m bench.workers_peak --redis-url URL [--workers 2] [--rounds 2] [--clients 32] [--seconds 8]``

Targets, each a real ``prefixgate serve`` process tree with the demo
configuration (:func:`sim.demo.gateway_config`: JWT-SVID, embedded OPA,
``cache_aware``, JSONL + OCSF audit in the audit worker process) in front of
two simulated replicas (in this process, time scale 10^6, no decode time):

- ``memory x1``: ``state.backend: memory``, one process (today's default);
- ``redis x1``: ``state.backend: redis`` on ``--redis-url``, one process;
- ``redis xN``: the same with ``--workers N``.

The tenant has a request rate and a concurrency limit high enough never to
refuse, so every request runs the shared-limit scripts. Load:
``--clients`` closed-loop clients for ``--seconds`` per target
(:func:`bench.overhead.closed_loop`, 64-word prompts, ``max_tokens`` 1),
targets interleaved, median over ``--rounds``. The load generator and the
replicas run in this process on the same machine as the gateway: they take
CPU from it (reported beside the figures with the load average).

Results: ``bench/results/workers_peak.{json,md}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from bench.harness import loadavg_text, write_json_and_markdown
from bench.overhead import _Body, closed_loop
from sim.click_options import ClickOptions
from sim.cluster import start_cluster
from sim.demo import DemoPaths, bearer_headers, gateway_config, prepare_identity
from sim.procs import (
    free_port,
    python_module_cmd,
    start_process,
    stop_process,
    wait_for_url,
)
from sim.replica import ReplicaConfig


async def _target(name: str, cfg: dict[str, Any], workers: int, paths: DemoPaths, headers: Any,
                  clients: int, seconds: float) -> dict[str, Any]:
    doc = json.loads(json.dumps(cfg))
    doc["listen"]["port"], doc["admin"]["port"] = free_port(), free_port()
    audit = paths.work / f"audit-{name.replace(' ', '_')}"
    doc["audit"]["jsonl"]["dir"] = str(audit / "jsonl")
    doc["audit"]["ocsf"]["file"] = str(audit / "ocsf.jsonl")
    doc["audit"]["spill"]["dir"] = str(audit / "spill")
    path = paths.work / f"{name.replace(' ', '_')}.yaml"
    path.write_text(yaml.safe_dump(doc))
    args = ["serve", "--config", str(path)] + (["--workers", str(workers)] if workers > 1 else [])
    proc = start_process(name.replace(" ", "_"), python_module_cmd("gateway.cli", *args), paths.logs)
    base = f"http://127.0.0.1:{doc['listen']['port']}"
    try:
        await wait_for_url(f"{base}/readyz", timeout_s=60, proc=proc)
        bodies = _Body(False)
        await closed_loop(f"{base}/v1/completions", headers, 4, 1.0, bodies)  # warm-up
        return await closed_loop(f"{base}/v1/completions", headers, clients, seconds, bodies)
    finally:
        stop_process(proc, timeout_s=30)


async def run(a: SimpleNamespace) -> dict[str, Any]:
    cluster = await start_cluster(2, ReplicaConfig(time_scale=1e6, decode_s_per_token=0.0))
    paths = DemoPaths.under(Path(a.work))
    issuer = prepare_identity(paths)
    headers = dict(bearer_headers(issuer, ["tenant-a"])("tenant-a"))
    base = gateway_config("cache_aware", cluster.ready_doc(), ["tenant-a"], paths, listen_port=0, admin_port=0)
    base["tenancy"]["tenants"][0].update(rate_rps=1e6, rate_burst=1e6, max_concurrency=10_000)
    redis_state = {"backend": "redis", "url": a.redis_url, "key_prefix": "pgpeak:"}
    targets = [("memory x1", {**base, "state": {"backend": "memory"}}, 1),
               ("redis x1", {**base, "state": redis_state}, 1),
               (f"redis x{a.workers}", {**base, "state": redis_state}, a.workers)]
    runs: dict[str, list[dict[str, Any]]] = {t[0]: [] for t in targets}
    try:
        for r in range(a.rounds):
            for name, cfg, workers in targets[r % 3:] + targets[:r % 3]:
                runs[name].append(await _target(name, cfg, workers, paths, headers, a.clients, a.seconds))
                print(name, runs[name][-1], flush=True)
    finally:
        await cluster.stop()
    med = {k: statistics.median(x["rps"] for x in v) for k, v in runs.items()}
    return {"runs": runs, "median_rps": med, "clients": a.clients, "seconds": a.seconds, "rounds": a.rounds,
            "workers_over_one": med[f"redis x{a.workers}"] / med["redis x1"], "loadavg": os.getloadavg(),
            "cpus": os.cpu_count()}


def _markdown(r: dict[str, Any]) -> str:
    rows = "\n".join(f"| {k} | {v:.1f} | {', '.join(str(x['rps']) for x in r['runs'][k])} | "
                     f"{sum(x['errors'] for x in r['runs'][k])} |" for k, v in r["median_rps"].items())
    return (f"# serve --workers: peak rate (bench/workers_peak.py)\n\n"
            f"{r['clients']} closed-loop clients x {r['seconds']} s per target, {r['rounds']} interleaved rounds; "
            f"load generator and replicas on the same {r['cpus']}-CPU machine (shared with other jobs; load "
            f"average after the run {loadavg_text(r['loadavg'])}).\n\n"
            f"| target | median req/s | runs | errors |\n|---|---|---|---|\n{rows}\n\n"
            f"workers / one redis process: {r['workers_over_one']:.2f}\n")


def main() -> None:
    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--redis-url", required=True)
    ap.option("--workers", type=int, default=2)
    ap.option("--rounds", type=int, default=2)
    ap.option("--clients", type=int, default=32)
    ap.option("--seconds", type=float, default=8.0)
    ap.option("--work", default="/tmp/prefixgate-workers-peak")
    ap.option("--out", default="bench/results/workers_peak")
    a = ap.parse()
    r = asyncio.run(run(a))
    write_json_and_markdown(a.out, r, _markdown(r))


if __name__ == "__main__":
    main()
