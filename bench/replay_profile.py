"""Where the gateway's time goes under a trace replay (issue 14, finding "latency grows under load"; not a test).

``python -m bench.replay_profile [--cell "time scale 20"] [--rows 300] [--no-profile]``: one
``sim.grid`` cell's replicas and gateway configuration (PrefixGate, ``cache_aware``, calibrated
default), the first ROWS Mooncake rows (``--workload NAME [--load X]``: the rows of another workload as
``sim.grid --workload`` replays them, session 21) replayed once (streaming) through a gateway run by
``bench.overhead --profiled-gateway`` (cProfile, thread CPU clock, switched on around the replay
only). Prints: the gateway process's CPU per request and its share of one core, the client-side
vs replica-side mean TTFT (the wall ms the gateway adds, as ``bench.ttft_split``), the audit
events' median latency fields, and the top functions of the profile (cumulative and own CPU per
request). Results: ``bench/results/replay-profile-<name>.txt``.
"""
from __future__ import annotations

import asyncio
import io
import json
import os
import pstats
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click
import psutil
import yaml

from bench.overhead import REPO, RESULTS, _spawn, audit_timings
from bench.ttft_split import ttft_sums
from sim.bounds import tenant_names
from sim.click_options import ClickOptions
from sim.demo import DemoPaths, bearer_headers, gateway_config, prepare_identity, run_target, start_cluster_proc
from sim.grid import CELLS, start_smg_router, workload_rows
from sim.workloads import WORKLOADS
from sim.procs import free_port, stop_process
from sim.replay import ReplayConfig
from sim.trace import DEFAULT_TRACE_PATH, assign_tenants, load_mooncake


async def run(args: SimpleNamespace) -> str:
    """The whole run (module doc); returns the report text."""
    cell = [c for c in CELLS if c.name == args.cell][0]
    work = Path(tempfile.mkdtemp(prefix="replay-prof-"))
    paths = DemoPaths.under(work)
    issuer = prepare_identity(paths)
    spec = cell.spec(6)
    if args.workload == "mooncake":
        reqs = load_mooncake(DEFAULT_TRACE_PATH, args.rows)
        names = tenant_names(cell.tenants)
        tenants = assign_tenants(reqs, names, 0)
    else:  # session 21: the live grid's other workloads, rows and tenants exactly as sim.grid replays them
        reqs, own = workload_rows(SimpleNamespace(workload=args.workload, load=args.load, seed=0, rows=args.rows,
                                                  replicas=6, trace=DEFAULT_TRACE_PATH))
        names = sorted(set(own)) if own else tenant_names(cell.tenants)
        tenants = own or assign_tenants(reqs, names, 0)
    cluster, replicas = await start_cluster_proc(spec, paths)
    urls = [r["url"] for r in replicas]
    out = work / "gateway.prof"
    lines: list[str] = [f"{args.router}{' from ' + str(args.tree) if args.tree else ''}: cell {cell.name!r}, "
                        f"workload {args.workload}{'' if args.workload == 'mooncake' else f' at load {args.load:g}'}, "
                        f"{args.rows} rows, profile {'off' if args.no_profile else 'on'}"]
    try:
        gcfg = gateway_config("cache_aware", replicas, names, paths, listen_port=free_port(), admin_port=free_port(),
                              block_size=spec.block_size, index_capacity_blocks=spec.capacity_blocks)
        cfg_path = paths.work / "gw.yaml"
        cfg_path.write_text(yaml.safe_dump(dict(gcfg), sort_keys=False))
        pg = args.router == "prefixgate"
        if pg:
            proc, base = await _spawn("gw", ["bench.replay_profile", "--gateway", str(cfg_path), "--profile-out",
                                             "-" if args.no_profile else str(out), "--gc-out", str(work / "gc.json")],
                                      paths, gcfg["listen"]["port"], "/readyz", tree=args.tree or REPO)
            probe_path = "/healthz"
        else:
            proc, base = await start_smg_router(urls, paths)
            probe_path = "/health"
            args.no_profile = True
        try:
            ps = psutil.Process(proc.pid)
            rcfg = ReplayConfig(base_url="", time_scale=spec.time_scale, seed=0,
                                total_timeout_s=6 * reqs[-1].timestamp / spec.time_scale + 180)
            if pg:
                os.kill(proc.pid, signal.SIGUSR1)
                await asyncio.sleep(0.3)
            c0 = ps.cpu_times()
            t0 = time.monotonic()
            probe_out = work / "probe.json"
            probe = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "bench.replay_profile", "--probe", base + probe_path, str(probe_out))
            try:
                summ, res = await run_target(args.router, base, urls, reqs, tenants, rcfg, None,
                                             headers_for=bearer_headers(issuer, names) if pg else None,
                                             salt_for=None if pg else (lambda t: t))
            finally:
                probe.send_signal(signal.SIGTERM)
                await probe.wait()
            probe_ms = json.loads(probe_out.read_text()) if probe_out.exists() else []
            wall = time.monotonic() - t0
            c1 = ps.cpu_times()
            if pg:
                os.kill(proc.pid, signal.SIGUSR2)
                deadline = time.monotonic() + 30
                while not (work / "gc.json").exists() or not (args.no_profile or out.exists()):
                    if time.monotonic() > deadline:
                        break
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
        if probe_ms:
            q = statistics.quantiles(probe_ms, n=100)
            lines.append(f"GET {probe_path} every 10 ms from another process during the replay ({len(probe_ms)} probes): p50 {q[49]:.2f}, "
                         f"p90 {q[89]:.2f}, p99 {q[98]:.2f}, max {max(probe_ms):.2f} ms, mean {statistics.fmean(probe_ms):.2f} ms")
        if pg:
            lines.append("audit latency medians (ms): " + json.dumps(audit_timings(paths.audit_dir / "jsonl", 0, n)))
            lines.append("audit latency means (ms): " + json.dumps(latency_means(paths.audit_dir / "jsonl")))
            gcf = work / "gc.json"
            if gcf.exists():
                lines.append("cyclic GC during the replay (per generation: collections, total ms, max ms): "
                             + gcf.read_text())
            busy = work / "gc.json.busy.txt"
            if busy.exists():
                lines.append(busy.read_text())
        if not args.no_profile and out.exists():
            buf = io.StringIO()
            st = pstats.Stats(str(out), stream=buf)
            st.sort_stats("cumulative").print_stats(45)
            st.sort_stats("tottime").print_stats(35)
            lines.append(buf.getvalue())
    finally:
        stop_process(cluster)
    return "\n".join(lines)


def _probe(url: str, out_file: str) -> None:
    """GET ``url`` every 10 ms on one keep-alive connection until SIGTERM; write the latencies (ms) to ``out_file``."""
    import aiohttp

    out: list[float] = []

    async def go() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        async with aiohttp.ClientSession() as sess:
            while not stop.is_set():
                t = time.perf_counter()
                async with sess.get(url) as r:
                    await r.read()
                out.append(1e3 * (time.perf_counter() - t))
                await asyncio.sleep(0.01)

    asyncio.run(go())
    Path(out_file).write_text(json.dumps(out))


class _BusySampler:
    """A thread sampling the main thread's Python stack every 2 ms (``sys._current_frames``) while
    ``active``: stretches where the event loop thread runs Python code without returning to the
    loop's idle wait (consecutive busy samples), their wall length and the main thread's CPU in
    them, and the stacks seen in stretches of 20 ms or more."""

    PERIOD_S = 0.002

    def __init__(self) -> None:
        import threading
        from collections import Counter

        self.active = False
        self.main = threading.main_thread().ident
        self.clock = time.pthread_getcpuclockid(self.main)
        self.stretches: list[tuple[float, float]] = []  # (wall ms, main-thread CPU ms)
        self.long_stacks: Counter[str] = Counter()
        self._cur: list[str] = []
        threading.Thread(target=self._run, daemon=True, name="busy-sampler").start()

    def _stack(self) -> str | None:
        f = sys._current_frames().get(self.main)
        names = []
        while f is not None:
            co = f.f_code
            names.append(f"{co.co_filename.rsplit('/', 2)[-2:][-1]}:{co.co_name}")
            f = f.f_back
        inner = [n for n in names if not n.startswith(("runners.py", "base_events.py", "server.py:run_serving",
                                                        "overhead.py", "replay_profile.py", "<frozen"))]
        return " < ".join(inner[:6]) if inner else None

    def _run(self) -> None:
        start_wall = start_cpu = 0.0
        while True:
            time.sleep(self.PERIOD_S)
            if not self.active:
                continue
            st = self._stack()
            if st is not None:
                if not self._cur:
                    start_wall, start_cpu = time.perf_counter(), time.clock_gettime(self.clock)
                self._cur.append(st)
            elif self._cur:
                wall = 1e3 * (time.perf_counter() - start_wall)
                cpu = 1e3 * (time.clock_gettime(self.clock) - start_cpu)
                self.stretches.append((wall, cpu))
                if wall >= 20:
                    self.long_stacks.update(self._cur)
                self._cur = []

    def report(self) -> str:
        """Busy stretches by length, and the most frequent stacks in long ones."""
        walls = sorted(w for w, _ in self.stretches)
        lines = [f"busy stretches: {len(walls)}"]
        for lo in (10, 20, 50, 100):
            sel = [(w, c) for w, c in self.stretches if w >= lo]
            lines.append(f"  >= {lo} ms: {len(sel)}, wall {sum(w for w, _ in sel):.0f} ms, main-thread CPU "
                         f"{sum(c for _, c in sel):.0f} ms")
        lines.append("stacks sampled in stretches >= 20 ms (count x 2 ms):")
        lines += [f"  {n:5d}  {st}" for st, n in self.long_stacks.most_common(40)]
        return "\n".join(lines) + "\n"


def _gateway(config_file: str, profile_out: str, gc_out: str) -> None:
    """``bench.overhead``'s profiled gateway, plus the cyclic GC's pauses per generation between
    SIGUSR1 and SIGUSR2 (written to ``gc_out`` at SIGUSR2)."""
    import gc

    import bench.overhead as ov
    from policy import reexec_with_go_gc

    reexec_with_go_gc(["-m", "bench.replay_profile", *sys.argv[1:]])  # before bench.overhead's own re-exec

    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    on = {"t": None, "active": False}

    def cb(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            on["t"] = time.perf_counter()
        elif on["t"] is not None and on["active"]:
            pauses[info["generation"]].append(1e3 * (time.perf_counter() - on["t"]))

    gc.callbacks.append(cb)
    # the sampler thread wakes every 2 ms and takes the GIL: only with the profiler (it inflates the wall figures)
    sampler = _BusySampler() if profile_out != "-" else None
    orig = signal.signal

    def hooked(sig: int, handler: Any) -> Any:  # wrap bench.overhead's start/stop handlers
        def wrapped(*a: Any) -> None:
            on["active"] = sig == signal.SIGUSR1
            if sampler is not None:
                sampler.active = on["active"]
            if profile_out != "-":
                handler(*a)
            if sig == signal.SIGUSR2:
                Path(gc_out).write_text(json.dumps({g: [len(v), round(sum(v), 1), round(max(v, default=0), 1)]
                                                    for g, v in pauses.items()}))
                if sampler is not None:
                    Path(gc_out + ".busy.txt").write_text(sampler.report())
        return orig(sig, wrapped)

    signal.signal = hooked  # type: ignore[assignment]
    ov._serve_profiled(config_file, profile_out)


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
    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--cell", default="time scale 20")
    ap.option("--rows", type=int, default=300)
    ap.option("--no-profile", is_flag=True)
    ap.option("--workload", type=click.Choice(("mooncake", *WORKLOADS)), default="mooncake",
              help="rows to replay, as `python -m sim.grid --workload` (session 21; default: the Mooncake trace)")
    ap.option("--load", type=float, default=0.7, help="load level of a non-Mooncake workload (sim.workloads)")
    ap.option("--name", default="ts20")
    ap.option("--router", type=click.Choice(("prefixgate", "smg")), default="prefixgate")
    ap.option("--tree", type=click.Path(path_type=Path), default=None,
              help="serve the gateway from this source tree (an export of another commit, holding a copy "
                   "of this file as bench/replay_profile.py): before/after")
    ap.option("--probe", nargs=2, hidden=True)
    ap.option("--gateway", hidden=True)
    ap.option("--profile-out", hidden=True)
    ap.option("--gc-out", hidden=True)
    args = ap.parse()
    if args.probe:
        _probe(*args.probe)
        return
    if args.gateway:
        _gateway(args.gateway, args.profile_out, args.gc_out)
        return
    text = asyncio.run(run(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"replay-profile-{args.name}.txt").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
