"""Session 27 (azure27): where PrefixGate's TTFT median goes in a ``sim.grid`` cell.

``python -m bench.azure27_diag run --workload azure-conv+sys --cell default --runs 1 --out FILE.json``
runs the grid's cell exactly as ``sim.grid`` does (same rows, replicas, gateway config,
``--pg-params``), once per router and run, and keeps what the grid drops: every request's client
TTFT (trace s) and cached tokens, each replica's ``/sim/stats`` (requests, queue wait, prefill busy),
the CPU seconds of the router, the replica cluster and this (client) process during the replay
(utime+stime from ``/proc/PID/stat``; the router's per thread from ``/proc/PID/task``
and its live child processes, such as PrefixGate's audit worker; the router's threads' time runnable
but waiting for a CPU from ``/proc/PID/task/*/schedstat``)
and, for PrefixGate, its audit events' latency split and route (``latency.*_ms`` wall ms,
``route.replica``). Output: one JSON document (no prompt text). ``python -m bench.azure27_diag
report FILE.json ...`` prints one Markdown row per (run, router) of such documents (TTFT quantiles are
nearest-rank over the answered requests, as the table says). Not part of the tests.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from sim.bounds import compute_bounds, tenant_names
from sim.demo import (DemoPaths, bearer_headers, gateway_config, prepare_identity, run_target,
                      start_cluster_proc, start_gateway)
from sim.grid import CELLS, start_smg_router, workload_rows
from sim.procs import free_port, stop_process
from sim.replay import ReplayConfig
from sim.report import fetch_replica_stats
from sim.trace import DEFAULT_TRACE_PATH, assign_tenants


def _cpu_s(pid: int) -> float:
    """utime + stime of ``pid`` and its reaped children (seconds)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / tick


def _children_cpu_s(pid: int) -> float:
    """utime + stime (seconds) of the live child processes of ``pid`` (e.g. the audit worker)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for st in Path("/proc").glob("[0-9]*/stat"):
        try:
            f = st.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[1]) == pid:
            total += (int(f[11]) + int(f[12])) / tick
    return total


def _run_queue_wait_s(pid: int) -> float:
    """Seconds the threads of ``pid`` spent runnable but waiting for a CPU (``/proc/PID/task/*/schedstat``
    second field, nanoseconds), summed."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue
    return total / 1e9


def _thread_cpu_s(pid: int) -> dict[str, float]:
    """utime + stime (seconds) of every live thread of ``pid``, keyed ``TID:name``."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            raw = (task / "stat").read_text()
        except OSError:
            continue
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        f = raw.rsplit(")", 1)[1].split()
        out[f"{task.name}:{name}"] = (int(f[11]) + int(f[12])) / tick
    return out


def _pin(pid: int, cpus: set[int]) -> None:
    """Set the CPU affinity of every thread of ``pid`` and of its live child processes' threads."""
    pids = [pid] + [int(st.parent.name) for st in Path("/proc").glob("[0-9]*/stat")
                    if _ppid(st) == pid]
    for p in pids:
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                os.sched_setaffinity(int(task.name), cpus)
            except OSError:
                pass


def _ppid(stat: Path) -> int:
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _audit(paths: DemoPaths, since_ms: int) -> list[dict[str, Any]]:
    out = []
    for f in sorted((paths.audit_dir / "jsonl").glob("*.jsonl")):
        for line in f.read_text(encoding="utf-8").splitlines():
            e = json.loads(line)
            b = e.get("body") or {}
            if e.get("type") == "event" and b.get("kind") == "inference" and b.get("time_ms", 0) >= since_ms:
                r = b.get("route") or {}
                out.append({"latency": b.get("latency"), "replica": r.get("replica"),
                            "predicted": r.get("predicted_prefix_tokens"),
                            "delivered": r.get("delivered_prefix_tokens"),
                            "prompt_tokens": b.get("prompt_tokens"), "tenant": b.get("tenant"),
                            "time_ms": b.get("time_ms")})
    return out


async def _main(a: SimpleNamespace) -> dict[str, Any]:
    cell = next(c for c in CELLS if c.name == a.cell)
    spec = cell.spec(a.replicas)
    reqs, own = workload_rows(a)
    names = sorted(set(own)) if own else tenant_names(cell.tenants)
    work = Path(tempfile.mkdtemp(prefix="azure27-diag-"))
    paths = DemoPaths.under(work)
    issuer = prepare_identity(paths)
    headers_for = bearer_headers(issuer, names)
    cluster, replicas = await start_cluster_proc(spec, paths)
    urls = [r["url"] for r in replicas]
    runs = []
    try:
        for run in range(a.runs):
            for router in a.routers.split(","):
                seed = a.seed + run
                tenants = own or assign_tenants(reqs, names, seed)
                bounds = compute_bounds(reqs, replicas=spec.replicas, capacity_blocks=spec.capacity_blocks,
                                        block_size=spec.block_size, tenants=names, seed=seed, assigned=tenants)
                rcfg = ReplayConfig(base_url="", time_scale=spec.time_scale, seed=seed,
                                    total_timeout_s=6 * reqs[-1].timestamp / spec.time_scale + 180)
                if router == "smg":
                    proc, base = await start_smg_router(urls, paths)
                else:
                    gcfg = gateway_config("cache_aware", replicas, names, paths, listen_port=free_port(),
                                          admin_port=free_port(), block_size=spec.block_size,
                                          index_capacity_blocks=spec.capacity_blocks,
                                          params=json.loads(a.pg_params) if a.pg_params else None)
                    if a.pg_flow:
                        gcfg["flow"] = json.loads(a.pg_flow)
                    proc, base = await start_gateway("gateway-cache_aware", gcfg, paths)
                if a.pin:
                    _pin(proc.pid, {1})
                    _pin(cluster.pid, {0})
                    _pin(os.getpid(), {0})
                since = int(time.time() * 1000)
                load0 = os.getloadavg()
                try:
                    cpu0, ccpu0, self0 = _cpu_s(proc.pid), _cpu_s(cluster.pid), _cpu_s(os.getpid())
                    thr0, kids0 = _thread_cpu_s(proc.pid), _children_cpu_s(proc.pid)
                    rq0 = _run_queue_wait_s(proc.pid)
                    summary, result = await run_target(
                        router, base, urls, reqs, tenants, rcfg, bounds,
                        headers_for=headers_for if router == "prefixgate" else None,
                        salt_for=(lambda t: t) if router == "smg" else None)
                    cpu = _cpu_s(proc.pid) - cpu0
                    kids = _children_cpu_s(proc.pid) - kids0
                    rq_wait = _run_queue_wait_s(proc.pid) - rq0
                    threads = {k: round(v - thr0.get(k, 0.0), 3) for k, v in _thread_cpu_s(proc.pid).items()}
                    cluster_cpu, client_cpu = _cpu_s(cluster.pid) - ccpu0, _cpu_s(os.getpid()) - self0
                finally:
                    stop_process(proc)
                stats = await fetch_replica_stats(urls)
                audit = _audit(paths, since) if router == "prefixgate" else []
                runs.append({
                    "run": run, "router": router, "loadavg_before": load0, "loadavg_after": os.getloadavg(),
                    "router_cpu_s": cpu, "router_children_cpu_s": kids, "router_run_queue_wait_s": rq_wait, "router_thread_cpu_s": {k: v for k, v in threads.items() if v > 0}, "cluster_cpu_s": cluster_cpu, "client_cpu_s": client_cpu, "wall_s": result.wall_s,
                    "summary": {k: getattr(summary, k) for k in ("hit_rate", "ttft_p50", "ttft_p90", "ttft_p99")},
                    "records": [{"i": r.index, "t": r.tenant, "ttft": r.ttft_s, "late": r.late_s,
                                 "prompt": r.prompt_tokens, "cached": r.cached_tokens, "err": r.error}
                                for r in result.records],
                    "replicas": [{k: s.get(k) for k in ("replica_id", "requests", "prefills", "prefill_busy_s",
                                                        "queue_wait_s", "prompt_tokens", "cached_tokens")}
                                 for s in stats],
                    "audit": audit,
                })
                print(f"run {run} {router}: p50 {summary.ttft_p50:.3f} p90 {summary.ttft_p90:.3f} "
                      f"cpu {cpu:.2f} s load {load0[0]:.2f}", flush=True)
    finally:
        stop_process(cluster)
    return {"cell": a.cell, "workload": a.workload, "load": a.load, "time_scale": spec.time_scale,
            "pg_params": a.pg_params, "pg_flow": a.pg_flow, "pin": a.pin, "runs": runs}


def _q(xs: list[float], p: float) -> float:
    """Nearest-rank quantile ``p`` (0..1) of ``xs``; NaN when empty."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


_PRE_ROUTE = ("auth_ms", "parse_ms", "keys_ms", "policy_ms", "route_ms", "queue_wait_ms")


def report_rows(doc: dict[str, Any], label: str) -> list[str]:
    """Markdown rows (the columns of :data:`REPORT_HEAD`) of one ``run`` document ``doc``: per (run, router)
    the load average before it, router CPU s (its threads above 0.05 s), the router threads' run-queue wait s
    (None in documents written before that field: "-"), PrefixGate's audit worker CPU s,
    hit rate, TTFT p50 / p90 (trace s) and p50 in wall ms, flow control's ``queue_wait_ms`` p50, the
    pre-route wait ``auth_ms`` p50 / p90, send -> first byte p50 (``first_byte_ms`` minus the pre-route
    latencies, wall ms), the replicas' mean queue wait and prefill (trace s) and requests per replica."""
    ts = doc["time_scale"]
    rows = []
    for r in doc["runs"]:
        tt = [x["ttft"] for x in r["records"] if x["ttft"] is not None]
        threads = sorted((v for v in r.get("router_thread_cpu_s", {}).values() if v > 0.05), reverse=True)
        n = sum(s["prefills"] for s in r["replicas"]) or 1
        rq = sum(s["queue_wait_s"] for s in r["replicas"]) / n
        pf = sum(s["prefill_busy_s"] for s in r["replicas"]) / n
        qw = au = up = "-"
        if r["audit"]:
            lat = [a["latency"] or {} for a in r["audit"]]
            qw = f"{_q([x.get('queue_wait_ms') or 0 for x in lat], .5):.2f}"
            auth = [x.get("auth_ms") or 0 for x in lat]
            au = f"{_q(auth, .5):.1f} / {_q(auth, .9):.1f}"
            up = f"{_q([(x.get('first_byte_ms') or 0) - sum(x.get(k) or 0 for k in _PRE_ROUTE) for x in lat], .5):.1f}"
        kids = r.get("router_children_cpu_s")
        rqw = r.get("router_run_queue_wait_s")
        kids_s = "-" if kids is None or r["router"] != "prefixgate" else f"{kids:.2f}"
        rows.append(
            f"| {label} | {r['run']} | {r['router']} | {r['loadavg_before'][0]:.2f} "
            f"| {r['router_cpu_s']:.2f} ({', '.join(f'{v:.2f}' for v in threads)}) | {'-' if rqw is None else f'{rqw:.2f}'} "
            f"| {kids_s} "
            f"| {r['summary']['hit_rate']:.3f} | {_q(tt, .5):.3f} / {_q(tt, .9):.3f} | {_q(tt, .5) * 1000 / ts:.1f} "
            f"| {qw} | {au} | {up} | {rq:.3f} / {pf:.3f} | {'/'.join(str(s['requests']) for s in r['replicas'])} |")
    return rows


REPORT_HEAD = ("| file | run | router | load before | router CPU s (threads > 0.05 s) | router waiting for a CPU s "
               "| audit worker CPU s | hit "
               "| TTFT p50 / p90 trace s | TTFT p50 wall ms | flow queue_wait p50 ms | pre-route wait (auth_ms) "
               "p50 / p90 ms | send -> first byte p50 ms | replica queue / prefill mean trace s "
               "| requests per replica |\n" + "|" + "---|" * 15)


@click.group()
def main() -> None:
    """Diagnose a grid cell (``run``) and tabulate the result (``report``)."""


@main.command("report")
@click.argument("files", nargs=-1, type=click.Path(exists=True, path_type=Path))
def report(files: tuple[Path, ...]) -> None:
    """Print the Markdown table of the ``run`` documents ``files``."""
    print(REPORT_HEAD)
    for f in files:
        print("\n".join(report_rows(json.loads(f.read_text(encoding="utf-8")), f.name)))


@main.command("run")
@click.option("--workload", default="azure-conv+sys")
@click.option("--load", type=float, default=0.7)
@click.option("--cell", default="default")
@click.option("--rows", type=int, default=500)
@click.option("--replicas", type=int, default=6)
@click.option("--runs", type=int, default=1)
@click.option("--seed", type=int, default=0)
@click.option("--routers", default="prefixgate,smg")
@click.option("--pg-params", default="")
@click.option("--pg-flow", default="", help="JSON flow section for PrefixGate (default: its defaults)")
@click.option("--pin", is_flag=True, help="the router (threads and children) on CPU 1, the cluster and this client on CPU 0")
@click.option("--out", type=click.Path(path_type=Path), required=True)
def run(**kw: Any) -> None:
    """Run the diagnosis and write the JSON document to ``--out``."""
    a = SimpleNamespace(trace=DEFAULT_TRACE_PATH, **kw)
    doc = asyncio.run(_main(a))
    kw["out"].write_text(json.dumps(doc) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
