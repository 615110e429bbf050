"""Where the gateway's time goes under a trace replay (issue 14, finding "latency grows under load"; not a test).

``python -m bench.replay_profile [--cell "time scale 20"] [--rows 300] [--no-profile]``: one
``sim.grid`` cell's replicas and gateway configuration (PrefixGate, ``cache_aware``, calibrated
default), the first ROWS Mooncake rows replayed once (streaming) through a gateway run by
``bench.overhead --profiled-gateway`` (cProfile, thread CPU clock, switched on around the replay
only). Prints: the gateway process's CPU per request and its share of one core, the client-side
vs replica-side mean TTFT (the wall ms the gateway adds, as ``bench.ttft_split``), the audit
events' median latency fields, and the top functions of the profile (cumulative and own CPU per
request). Results: ``bench/results/replay-profile-<name>.txt``.
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import pstats
import signal
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from bench.overhead import RESULTS, _spawn, audit_timings
from bench.ttft_split import ttft_sums
from sim.bounds import tenant_names
from sim.demo import DemoPaths, bearer_headers, gateway_config, prepare_identity, run_target, start_cluster_proc
from sim.grid import CELLS
from sim.procs import free_port, stop_process
from sim.replay import ReplayConfig
from sim.trace import DEFAULT_TRACE_PATH, assign_tenants, load_mooncake


async def run(args: argparse.Namespace) -> str:
    """The whole run (module doc); returns the report text."""
    cell = [c for c in CELLS if c.name == args.cell][0]
    work = Path(tempfile.mkdtemp(prefix="replay-prof-"))
    paths = DemoPaths.under(work)
    issuer = prepare_identity(paths)
    spec = cell.spec(6)
    reqs = load_mooncake(DEFAULT_TRACE_PATH, args.rows)
    names = tenant_names(cell.tenants)
    tenants = assign_tenants(reqs, names, 0)
    cluster, replicas = await start_cluster_proc(spec, paths)
    urls = [r["url"] for r in replicas]
    out = work / "gateway.prof"
    lines: list[str] = [f"cell {cell.name!r}, {args.rows} rows, profile {'off' if args.no_profile else 'on'}"]
    try:
        gcfg = gateway_config("cache_aware", replicas, names, paths, listen_port=free_port(), admin_port=free_port(),
                              block_size=spec.block_size, index_capacity_blocks=spec.capacity_blocks)
        cfg_path = paths.work / "gw.yaml"
        cfg_path.write_text(yaml.safe_dump(dict(gcfg), sort_keys=False))
        proc, base = await _spawn("gw", ["bench.overhead", "--profiled-gateway", str(cfg_path),
                                         "--profile-out", str(out)], paths, gcfg["listen"]["port"], "/readyz")
        try:
            ps = psutil.Process(proc.pid)
            rcfg = ReplayConfig(base_url="", time_scale=spec.time_scale, seed=0,
                                total_timeout_s=6 * reqs[-1].timestamp / spec.time_scale + 180)
            if not args.no_profile:
                os.kill(proc.pid, signal.SIGUSR1)
                await asyncio.sleep(0.3)
            c0 = ps.cpu_times()
            t0 = time.monotonic()
            summ, res = await run_target("prefixgate", base, urls, reqs, tenants, rcfg, None,
                                         headers_for=bearer_headers(issuer, names))
            wall = time.monotonic() - t0
            c1 = ps.cpu_times()
            if not args.no_profile:
                os.kill(proc.pid, signal.SIGUSR2)
                deadline = time.monotonic() + 30
                while not out.exists() and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
            s1, n1 = await ttft_sums(urls)
        finally:
            stop_process(proc)
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        n = len(res.records)
        client = [r.ttft_s for r in res.records if r.ttft_s is not None]
        cm, rm = sum(client) / len(client), s1 / n1
        lines.append(f"gateway process CPU {cpu:.2f} s over {wall:.1f} s wall ({100 * cpu / wall:.0f} % of one core), "
                     f"{1e3 * cpu / n:.2f} ms per request ({n} requests)")
        lines.append(f"client mean TTFT {cm:.3f} s, replica-side {rm:.3f} s, added {cm - rm:.3f} s trace = "
                     f"{1000 * (cm - rm) / spec.time_scale:.1f} ms wall; client p50 {summ.ttft_p50:.3f} s; "
                     f"errors {sum(1 for r in res.records if r.error)}")
        lines.append("audit latency medians (ms): " + json.dumps(audit_timings(paths.audit_dir / "jsonl", 0, n)))
        lines.append("audit latency means (ms): " + json.dumps(latency_means(paths.audit_dir / "jsonl")))
        if not args.no_profile and out.exists():
            buf = io.StringIO()
            st = pstats.Stats(str(out), stream=buf)
            st.sort_stats("cumulative").print_stats(45)
            st.sort_stats("tottime").print_stats(35)
            lines.append(buf.getvalue())
    finally:
        stop_process(cluster)
    return "\n".join(lines)


def latency_means(jsonl_dir: Path) -> dict[str, float]:
    """Means (ms) of the audit events' ``latency`` fields over every event in ``jsonl_dir``."""
    from bench.overhead import _find_latency

    lats = [lat for f in sorted(jsonl_dir.glob("*.jsonl")) for line in f.read_text().splitlines()
            if line.startswith("{") and (lat := _find_latency(json.loads(line))) is not None]
    keys = sorted({k for lat in lats for k, v in lat.items() if isinstance(v, (int, float))})
    return {k: round(statistics.fmean(v), 3) for k in keys
            if (v := [lat[k] for lat in lats if isinstance(lat.get(k), (int, float))])}


def main() -> None:
    """Command line (module doc)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cell", default="time scale 20")
    ap.add_argument("--rows", type=int, default=300)
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--name", default="ts20")
    args = ap.parse_args()
    text = asyncio.run(run(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"replay-profile-{args.name}.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
