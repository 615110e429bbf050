"""Gateway process CPU per request, this tree vs another, interleaved (not a test).

``python -m bench.gateway_cpu_ab --baseline DIR [--rounds 8] [--requests 1000]``

For A/B of a change on a shared machine, where wall-clock latencies move by
2x between minutes: one simulated replica that answers at once, two
``prefixgate serve`` processes started the same way (this tree;
``--baseline``, another source tree, e.g. ``git archive BASE | tar -x -C
DIR``; pass this tree itself for an A/A check) with the configuration of
:mod:`bench.overhead` (JWT-SVID, HMAC chain, embedded OPA, JSONL + OCSF
audit in the worker process). Rounds alternate A, B / B, A; per round
``--requests`` sequential requests on one keep-alive connection (64 unique
words, ``max_tokens`` 1). Reported per round and as medians: the gateway
process's own CPU (psutil, user + system, all threads; the audit worker and
span children excluded) in µs per request, and the sequential p50 in ms.
The CPU figure is the stable one; the p50 follows the machine's load.
Unless ``--no-pin``, both gateways and their children run on the last CPU
and the load generator and the replica on the others (unpinned, the process
started first measured ~130 µs/request more than the second in A/B and B/A
runs of the same two trees: placement, not code).
Results: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

import yaml

from bench.overhead import REPO, RESULTS, WARMUP, _Body, _Cpu, _second_config, _spawn, measured, sequential
from sim.click_options import ClickOptions


async def run(baseline: Path, rounds: int, requests: int, pin: bool = True) -> dict[str, Any]:
    """The A/B (module doc); returns the result document."""
    from sim.demo import ClusterSpec, DemoPaths, bearer_headers, gateway_config, prepare_identity, start_cluster_proc
    from sim.procs import free_port, stop_process

    paths = DemoPaths.under(Path(tempfile.mkdtemp(prefix="pg-cpu-ab-")))
    issuer = prepare_identity(paths)
    cluster, replicas = await start_cluster_proc(ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0),
                                                 paths)
    procs: list[Any] = []
    bodies = _Body(False)
    try:
        cfg = gateway_config("cache_aware", replicas, ["tenant-a"], paths, listen_port=free_port(),
                             admin_port=free_port())
        started = {}
        for name, tree in (("this", REPO), ("baseline", baseline)):  # both started the same way
            doc = _second_config(cfg, paths, name)
            doc["policy"]["dir"] = str(tree / "rego")
            cfg_path = paths.work / f"{name}.yaml"
            cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
            proc, url = await _spawn(name, ["gateway.cli", "serve", "--config", str(cfg_path)], paths,
                                     doc["listen"]["port"], "/readyz", tree=tree)
            procs.append(proc)
            started[name] = (proc, url)
        (pg, pg_url), (bl, bl_url) = started["this"], started["baseline"]
        if pin:  # both gateways (and their children) on the last CPU, the client and the replica on the others
            import os

            import psutil

            cpus = sorted(os.sched_getaffinity(0))
            if len(cpus) > 1:
                for proc in (pg, bl):
                    for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
                        p.cpu_affinity([cpus[-1]])
                for p in [psutil.Process(cluster.pid), *psutil.Process(cluster.pid).children(recursive=True),
                          psutil.Process()]:
                    p.cpu_affinity(cpus[:-1])
        headers = {"Content-Type": "application/json", **dict(bearer_headers(issuer, ["tenant-a"])("tenant-a"))}
        targets = {"this": (pg_url, _Cpu(pg.pid, children=False)), "baseline": (bl_url, _Cpu(bl.pid, children=False))}
        for url, _ in targets.values():
            await sequential(url + "/v1/completions", headers, WARMUP * 4, bodies)
        rows: list[dict[str, Any]] = []
        for r in range(rounds):
            order = ["this", "baseline"] if r % 2 == 0 else ["baseline", "this"]
            row: dict[str, Any] = {}
            for name in order:
                url, cpu = targets[name]
                seq, us = await measured(cpu, requests, sequential(url + "/v1/completions", headers, requests, bodies))
                row[name] = {"cpu_us": us, "p50_ms": seq["p50_ms"], "errors": seq["errors"]}
            rows.append(row)
            print(f"round {r + 1}/{rounds}: " + ", ".join(f"{n} {row[n]['cpu_us']} µs {row[n]['p50_ms']} ms"
                                                        for n in ("this", "baseline")), flush=True)
    finally:
        for p in procs:
            stop_process(p)
        stop_process(cluster)
        shutil.rmtree(paths.work, ignore_errors=True)
    med = {n: {k: statistics.median(row[n][k] for row in rows) for k in ("cpu_us", "p50_ms")}
           for n in ("this", "baseline")}
    diff = statistics.median(row["this"]["cpu_us"] - row["baseline"]["cpu_us"] for row in rows)
    return {"benchmark": "gateway_cpu_ab", "baseline": str(baseline), "rounds": rows, "median": med,
            "median_cpu_diff_us": diff, "requests_per_round": requests}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point."""
    ap = ClickOptions(prog="python -m bench.gateway_cpu_ab", description=__doc__.splitlines()[0])
    ap.option("--baseline", type=click.Path(path_type=Path), required=True)
    ap.option("--rounds", type=int, default=8)
    ap.option("--requests", type=int, default=1000)
    ap.option("--no-pin", is_flag=True, help="do not pin the gateways to one CPU and the rest to the others")
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS)
    ap.option("--name", default="gateway_cpu_ab")
    args = ap.parse(argv)
    import uvloop

    doc = uvloop.run(run(args.baseline, args.rounds, args.requests, not args.no_pin))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"# Gateway CPU per request, A/B (`python -m bench.gateway_cpu_ab`, baseline {doc['baseline']})", "",
             f"{args.rounds} interleaved rounds of {args.requests} sequential requests.", "",
             "| round | this µs/req | baseline µs/req | this p50 ms | baseline p50 ms |", "|---|---:|---:|---:|---:|"]
    for i, row in enumerate(doc["rounds"], 1):
        lines.append(f"| {i} | {row['this']['cpu_us']} | {row['baseline']['cpu_us']} | {row['this']['p50_ms']} | "
                     f"{row['baseline']['p50_ms']} |")
    m = doc["median"]
    lines += ["", f"Median: this {m['this']['cpu_us']} µs, {m['this']['p50_ms']} ms; baseline "
              f"{m['baseline']['cpu_us']} µs, {m['baseline']['p50_ms']} ms; median per-round CPU difference "
              f"{doc['median_cpu_diff_us']} µs/request."]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
