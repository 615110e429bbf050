"""Peak rate of ``prefixgate serve`` with 1 process and with ``--workers N`` (issue 16; not a test).

``python -m bench.workers_peak [--redis-url URL] [--workers 2] [--rounds 2] [--clients 32] [--seconds 8]
[--load-generator python|wrk|python,wrk] [--label TEXT]``

Targets, each a real ``prefixgate serve`` process tree with the demo
configuration (:func:`sim.demo.gateway_config`: JWT-SVID, embedded OPA,
``cache_aware``, JSONL + OCSF audit in the audit worker process) in front of
two simulated replicas (``python -m sim.cluster`` in its own process, time
scale 10^6, no decode time):

- ``memory x1``: ``state.backend: memory``, one process (today's default);
- ``redis x1``: ``state.backend: redis`` on ``--redis-url``, one process;
- ``redis xN``: the same with ``--workers N``.

Without ``--redis-url`` the bench starts its own ``redis-server``
(:class:`sim.redis_server.RedisServer`). The tenant has a request rate and a
concurrency limit high enough never to refuse, so every request runs the
shared-limit scripts. Load: ``--clients`` closed-loop clients (or wrk
connections) for ``--seconds`` per target and load generator
(:func:`bench.loadgen.peak`, 64-word prompts, ``max_tokens`` 1), after 1 s of
unmeasured warm-up with the same generator; targets interleaved (rotated per
round), generators alternated per round, median over ``--rounds``. The load
generator, the replicas and Redis run on the same machine as the gateway and
take CPU from it: the result gives, beside every figure, the cores used by
the load generator (``python``: this process, which runs nothing else
meanwhile; ``wrk``: the wrk child), by the gateway's process tree and by the
replicas over the measured window.

Results: ``bench/results/<--out>.{json,md}`` (default ``workers_peak``).
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml

from bench import loadgen
from bench.harness import loadavg_text, start_demo_stack, write_json_and_markdown
from bench.overhead import _Cpu
from sim.click_options import ClickOptions
from sim.demo import ClusterSpec, DemoPaths
from sim.procs import free_port, python_module_cmd, start_process, stop_process, wait_for_url


async def _measure(generator: str, url: str, headers: Any, clients: int, seconds: float,
                   gateway: _Cpu, replicas: _Cpu) -> dict[str, Any]:
    """One warm-up second, then the measured peak with the gateway's and the replicas' cores beside it."""
    bodies = loadgen._Body(False)
    await loadgen.peak(generator, url, headers, clients, 1.0, bodies)  # warm-up: connections, pools, caches
    g0, r0, t0 = gateway.seconds(), replicas.seconds(), time.monotonic()
    res = await loadgen.peak(generator, url, headers, clients, seconds, bodies)
    wall = time.monotonic() - t0
    return {**{k: v for k, v in res.items() if k != "wrk"}, "gateway_cores": round((gateway.seconds() - g0) / wall, 3),
            "replica_cores": round((replicas.seconds() - r0) / wall, 3)}


async def _target(name: str, cfg: dict[str, Any], workers: int, paths: DemoPaths, headers: Any,
                  a: SimpleNamespace, generators: list[str], replicas: _Cpu) -> dict[str, dict[str, Any]]:
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
        gateway = _Cpu(proc.pid)
        return {g: await _measure(g, f"{base}/v1/completions", headers, a.clients, a.seconds, gateway, replicas)
                for g in generators}
    finally:
        stop_process(proc, timeout_s=30)


async def run(a: SimpleNamespace) -> dict[str, Any]:
    """Run the rounds of ``a`` (see module doc); returns the result document."""
    from sim.redis_server import REDIS_SERVER, RedisServer

    generators = [g for g in a.load_generator.split(",") if g]
    for g in generators:
        loadgen.require_generator(g)
    work = Path(tempfile.mkdtemp(prefix="prefixgate-workers-peak-", dir=a.work))
    redis = None
    if not a.redis_url:
        (work / "redis").mkdir(parents=True, exist_ok=True)
        redis = RedisServer(REDIS_SERVER or "/usr/bin/redis-server", work / "redis").start()
    redis_url = a.redis_url or redis.url  # type: ignore[union-attr]
    stack = await start_demo_stack(work, ClusterSpec(replicas=2, time_scale=1e6, decode_s_per_token=0.0))
    headers = {"Content-Type": "application/json", **dict(stack.headers_for(["tenant-a"])("tenant-a"))}
    base = stack.gateway_config(["tenant-a"])
    base["tenancy"]["tenants"][0].update(rate_rps=1e6, rate_burst=1e6, max_concurrency=10_000)
    redis_state = {"backend": "redis", "url": redis_url, "key_prefix": "pgpeak:"}
    targets = [("memory x1", {**base, "state": {"backend": "memory"}}, 1),
               ("redis x1", {**base, "state": redis_state}, 1),
               (f"redis x{a.workers}", {**base, "state": redis_state}, a.workers)]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {g: {t[0]: [] for t in targets} for g in generators}
    replicas = _Cpu(stack.cluster.pid)
    try:
        for r in range(a.rounds):
            gens = generators[r % len(generators):] + generators[:r % len(generators)]
            for name, cfg, workers in targets[r % 3:] + targets[:r % 3]:
                res = await _target(name, cfg, workers, stack.paths, headers, a, gens, replicas)
                for g, x in res.items():
                    runs[g][name].append(x)
                    print(f"round {r + 1} {name:10s} {g:6s} {x['rps']:.0f} req/s, load generator {x['loadgen_cores']} "
                          f"cores, gateway {x['gateway_cores']}, replicas {x['replica_cores']}, errors {x['errors']}",
                          flush=True)
    finally:
        stack.stop()
        if redis is not None:
            redis.stop()

    def med(xs: list[dict[str, Any]], key: str) -> float:
        return round(statistics.median(x[key] for x in xs), 3)

    summary = {g: {name: {k: med(xs, k) for k in ("rps", "loadgen_cores", "gateway_cores", "replica_cores")}
                   | {"errors": sum(x["errors"] for x in xs)} for name, xs in per.items()} for g, per in runs.items()}
    return {"label": a.label, "runs": runs, "summary": summary, "clients": a.clients, "seconds": a.seconds,
            "rounds": a.rounds, "workers": a.workers, "generators": generators,
            "workers_over_one": {g: round(s[f"redis x{a.workers}"]["rps"] / s["redis x1"]["rps"], 3)
                                 for g, s in summary.items()},
            "loadavg": os.getloadavg(), "cpus": os.cpu_count()}


def _markdown(r: dict[str, Any]) -> str:
    rows = "\n".join(f"| {name} | {g} | {s['rps']:.1f} | {', '.join(str(x['rps']) for x in r['runs'][g][name])} | "
                     f"{s['loadgen_cores']:.2f} | {s['gateway_cores']:.2f} | {s['replica_cores']:.2f} | {s['errors']} |"
                     for g, per in r["summary"].items() for name, s in per.items())
    ratios = "; ".join(f"{g}: {v:.2f}" for g, v in r["workers_over_one"].items())
    return (f"# serve --workers: peak rate (bench/workers_peak.py)\n\n"
            f"{r['label']}\n\n"
            f"{r['clients']} closed-loop clients (wrk: connections) x {r['seconds']} s per target and load generator, "
            f"{r['rounds']} interleaved rounds; load generator, replicas and Redis on the same {r['cpus']}-CPU machine "
            f"as the gateway (load average after the run {loadavg_text(r['loadavg'])}). Cores = CPU seconds / wall "
            f"seconds over the measured window (1.00 = one whole core).\n\n"
            f"| target | load generator | median req/s | runs | load gen cores | gateway cores | replica cores | "
            f"errors |\n|---|---|---:|---|---:|---:|---:|---:|\n{rows}\n\n"
            f"redis x{r['workers']} / redis x1 (median req/s): {ratios}\n")


def main() -> None:
    """``python -m bench.workers_peak``: run and write ``<--out>.{json,md}``."""
    ap = ClickOptions(prog="python -m bench.workers_peak", description=__doc__.splitlines()[0])
    ap.option("--redis-url", default=None, help="default: start a redis-server of our own")
    ap.option("--workers", type=int, default=2)
    ap.option("--rounds", type=int, default=2)
    ap.option("--clients", type=int, default=32)
    ap.option("--seconds", type=float, default=8.0)
    ap.option("--load-generator", default="python",
              help="python, wrk, or a comma-separated list (python,wrk): each target measured with each")
    ap.option("--label", default="Machine: not stated.", help="a line saying where it ran (quiet or shared machine)")
    ap.option("--work", default=None, help="parent of the work directory (default: the system's temp dir)")
    ap.option("--out", default="bench/results/workers_peak")
    a = ap.parse()
    try:
        for g in a.load_generator.split(","):
            loadgen.require_generator(g)
    except (loadgen.WrkMissingError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None
    r = asyncio.run(run(a))
    write_json_and_markdown(a.out, r, _markdown(r))


if __name__ == "__main__":
    main()
