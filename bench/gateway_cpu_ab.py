"""Gateway process CPU per request, this tree vs another, interleaved (not a test).

``python -m bench.gateway_cpu_ab --baseline DIR [--rounds 8] [--requests 1000]``

For A/B of a change on a shared machine, where wall-clock latencies move by
2x between minutes: one simulated replica that answers at once, two
``prefixgate serve`` processes started the same way (this tree;
``--baseline``, another source tree, e.g. ``git archive BASE | tar -x -C
DIR``; pass this tree itself for an A/A check) with the configuration of
:mod:`bench.overhead` (JWT-SVID, HMAC chain, embedded OPA, JSONL + OCSF
audit in the worker process). Every round starts both gateways afresh (own
ports and audit directory), in a start order that alternates every round, and
measures them in an order that alternates every two rounds (:func:`orders`;
session 9: with the start order fixed, the gateway started first read tens of
µs/request lower in A/A runs); per round ``--requests`` sequential requests on
one keep-alive connection (64 unique words, ``max_tokens`` 1), after a warm-up. Reported per round and as medians: the gateway
process's own CPU (psutil, user + system, all threads; the audit worker and
span children excluded) in µs per request, and the sequential p50 in ms.
The CPU figure is the stable one; the p50 follows the machine's load.
Unless ``--no-pin``, both gateways and their children run on the last CPU
and the load generator and the replica on the others (unpinned, the process
started first measured ~130 µs/request more than the second in A/B and B/A
runs of the same two trees: placement, not code).
Session 31: also the CPU of the gateway with its descendants (the audit worker process: what
:mod:`bench.overhead`'s sequential CPU column counts), per round and as medians.
Results: ``bench/results/<name>.{json,md}``.
"""

from __future__ import annotations

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


async def _start_pair(cfg: dict[str, Any], paths: Any, trees: dict[str, Path], order: Sequence[str], tag: str,
                      cluster: Any, pin: bool) -> dict[str, tuple[Any, str]]:
    """Start one ``prefixgate serve`` per tree of ``trees``, in ``order``, each with its own ports and audit
    directory (``tag`` names them); pinned as the module doc says. Returns name -> (process, base URL)."""
    started: dict[str, tuple[Any, str]] = {}
    try:
        for name in order:  # both started the same way
            doc = _second_config(cfg, paths, f"{name}-{tag}")
            doc["policy"]["dir"] = str(trees[name] / "rego")
            cfg_path = paths.work / f"{name}-{tag}.yaml"
            cfg_path.write_text(yaml.safe_dump(doc, sort_keys=False))
            started[name] = await _spawn(f"{name}-{tag}", ["gateway.cli", "serve", "--config", str(cfg_path)], paths,
                                         doc["listen"]["port"], "/readyz", tree=trees[name])
    except BaseException:
        _stop_pair(started)
        raise
    if pin:  # both gateways (and their children) on the last CPU, the client and the replica on the others
        import os

        import psutil

        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > 1:
            for proc, _ in started.values():
                for p in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
                    p.cpu_affinity([cpus[-1]])
            for p in [psutil.Process(cluster.pid), *psutil.Process(cluster.pid).children(recursive=True),
                      psutil.Process()]:
                p.cpu_affinity(cpus[:-1])
    return started


def _stop_pair(started: dict[str, tuple[Any, str]]) -> None:
    from sim.procs import stop_process

    for proc, _ in started.values():
        stop_process(proc)


def orders(r: int) -> tuple[list[str], list[str]]:
    """Round ``r``'s (start order, measuring order) of the two trees: the start order alternates every
    round, the measuring order every two rounds, so every 4 rounds hold each combination once (session 9:
    the gateway started first read lower by tens of µs/request in A/A runs when it was always "this")."""
    ab, ba = ["this", "baseline"], ["baseline", "this"]
    return (ab if r % 2 == 0 else ba), (ab if (r // 2) % 2 == 0 else ba)


async def run(baseline: Path, rounds: int, requests: int, pin: bool = True) -> dict[str, Any]:
    """The A/B (module doc); returns the result document."""
    from sim.demo import ClusterSpec, DemoPaths, bearer_headers, gateway_config, prepare_identity, start_cluster_proc
    from sim.procs import free_port, stop_process

    paths = DemoPaths.under(Path(tempfile.mkdtemp(prefix="pg-cpu-ab-")))
    issuer = prepare_identity(paths)
    cluster, replicas = await start_cluster_proc(ClusterSpec(replicas=1, time_scale=1e6, decode_s_per_token=0.0),
                                                 paths)
    bodies = _Body(False)
    trees = {"this": REPO, "baseline": baseline}
    started: dict[str, tuple[Any, str]] = {}
    try:
        cfg = gateway_config("cache_aware", replicas, ["tenant-a"], paths, listen_port=free_port(),
                             admin_port=free_port())
        headers = {"Content-Type": "application/json", **dict(bearer_headers(issuer, ["tenant-a"])("tenant-a"))}
        rows: list[dict[str, Any]] = []
        for r in range(rounds):
            start_order, measure_order = orders(r)
            started = await _start_pair(cfg, paths, trees, start_order, f"r{r}", cluster, pin)
            targets = {n: (url, _Cpu(proc.pid, children=False), _Cpu(proc.pid, children=True))
                       for n, (proc, url) in started.items()}
            for name in measure_order:
                await sequential(targets[name][0] + "/v1/completions", headers, WARMUP * 4, bodies)
            row: dict[str, Any] = {"started_first": start_order[0], "measured_first": measure_order[0]}
            for name in measure_order:
                url, cpu, whole = targets[name]
                w0 = whole.seconds()
                seq, us = await measured(cpu, requests, sequential(url + "/v1/completions", headers, requests, bodies))
                row[name] = {"cpu_us": us, "p50_ms": seq["p50_ms"], "errors": seq["errors"],
                             "with_children_us": round((whole.seconds() - w0) * 1e6 / requests, 1)}
            _stop_pair(started)
            started = {}
            rows.append(row)
            print(f"round {r + 1}/{rounds} (started first {start_order[0]}, measured first {measure_order[0]}): "
                  + ", ".join(f"{n} {row[n]['cpu_us']} µs {row[n]['p50_ms']} ms" for n in ("this", "baseline")),
                  flush=True)
    finally:
        _stop_pair(started)
        stop_process(cluster)
        shutil.rmtree(paths.work, ignore_errors=True)
    med = {n: {k: statistics.median(row[n][k] for row in rows) for k in ("cpu_us", "p50_ms", "with_children_us")}
           for n in ("this", "baseline")}
    diff = statistics.median(row["this"]["cpu_us"] - row["baseline"]["cpu_us"] for row in rows)
    by_start = {first: statistics.median(row["this"]["cpu_us"] - row["baseline"]["cpu_us"] for row in rows
                                         if row["started_first"] == first)
                for first in ("this", "baseline") if any(row["started_first"] == first for row in rows)}
    diff_all = statistics.median(row["this"]["with_children_us"] - row["baseline"]["with_children_us"] for row in rows)
    return {"benchmark": "gateway_cpu_ab", "baseline": str(baseline), "rounds": rows, "median": med,
            "median_cpu_diff_us": diff, "median_with_children_diff_us": diff_all, "median_cpu_diff_by_started_first_us": by_start,
            "requests_per_round": requests}


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
             f"{args.rounds} interleaved rounds of {args.requests} sequential requests (both gateways restarted "
             "every round; start order alternating every round, measuring order every two).", "",
             "| round | started first | measured first | this µs/req | baseline µs/req | this with children | "
             "baseline with children | this p50 ms | baseline p50 ms |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for i, row in enumerate(doc["rounds"], 1):
        lines.append(f"| {i} | {row['started_first']} | {row['measured_first']} | {row['this']['cpu_us']} | "
                     f"{row['baseline']['cpu_us']} | {row['this']['with_children_us']} | "
                     f"{row['baseline']['with_children_us']} | {row['this']['p50_ms']} | {row['baseline']['p50_ms']} |")
    m = doc["median"]
    lines += ["", f"Median: this {m['this']['cpu_us']} µs, {m['this']['p50_ms']} ms; baseline "
              f"{m['baseline']['cpu_us']} µs, {m['baseline']['p50_ms']} ms; median per-round CPU difference "
              f"{doc['median_cpu_diff_us']} µs/request; by the tree started first: "
              + ", ".join(f"{k} first {v:+}" for k, v in doc["median_cpu_diff_by_started_first_us"].items()) + "."
              f" With children (the audit worker; session 31): this {m['this']['with_children_us']}, baseline "
              f"{m['baseline']['with_children_us']}, median per-round difference {doc['median_with_children_diff_us']}."]
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
