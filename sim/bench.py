"""Side-by-side benchmark: PrefixGate vs SGLang's router in front of the same simulated replicas.

``python -m sim.bench`` (``make bench``; not part of the tests). Two parts:

1. **Trace replay.** The first ``--rows`` (2000) rows of the Mooncake trace,
   6 simulated replicas (16-token KV blocks, 4000 blocks each, 10k real
   tokens/s prefill each), arrivals at the trace's own rate divided by
   ``--time-scale``. Targets: PrefixGate ``round_robin`` and ``cache_aware``,
   and SGLang's router, ``python -m smg.launch_router --policy round_robin|cache_aware``
   (Shepherd Model Gateway, the ``smg`` package: the current release of ``sglang-router``)
   (SGLang gets each tenant's ``cache_salt`` in the body so replica caches are
   partitioned exactly as PrefixGate partitions them). ``--runs`` (3) seeded
   runs each, interleaved; the table holds the field-wise median.
2. **Router overhead.** A second cluster at a very high time scale (replica
   service time ~0) and small prompts (one 512-token trace block = 32
   simulator tokens, ``max_tokens`` 1, unique prefixes). Added latency =
   router TTFT minus direct-to-replica TTFT at a fixed low rate (20 req/s,
   30 s). Highest sustained rate = the highest step (30 s each, rates
   doubling) with no errors and p99 added latency (minus the direct path at
   the same rate) at most 2x its low-rate value (floor 1 ms). The load
   generator and every server share this machine's 2 cores, so the
   sustained rate is a lower bound set partly by the client (the direct
   row shows that ceiling).

Time scale: the 2000 rows span 669 trace seconds; at the default
``--time-scale 8`` one run takes ~85 s of wall time, 12 runs ~19 min, and the
overhead part ~15 min: ~35-40 min in all on this machine. Results:
``bench/results/bench.{md,json}``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import click

from sim.bounds import compute_bounds, tenant_names
from sim.click_options import ClickOptions
from sim.demo import (
    RESULTS_DIR,
    ClusterSpec,
    DemoPaths,
    bearer_headers,
    gateway_config,
    prepare_identity,
    run_target,
    start_cluster_proc,
    start_gateway,
)
from sim.procs import ManagedProcess, free_port, python_module_cmd, start_process, stop_process, wait_for_url
from sim.replay import HeadersFor, ReplayConfig, ReplayResult, replay
from sim.report import RouterSummary, median_summary, percentile, render_markdown
from sim.trace import DEFAULT_TRACE_PATH, TraceRequest, assign_tenants, load_mooncake

__all__ = ["Target", "TARGETS", "start_sglang_router", "synthetic_requests", "OverheadResult", "main"]


@dataclasses.dataclass(frozen=True)
class Target:
    """A router under test: ``kind`` is ``prefixgate`` or ``sglang``; ``policy`` its routing policy."""

    kind: str
    policy: str

    @property
    def label(self) -> str:
        """Display name, e.g. ``prefixgate/cache_aware``."""
        return f"{self.kind}/{self.policy}"


TARGETS = (
    Target("prefixgate", "round_robin"),
    Target("prefixgate", "cache_aware"),
    Target("sglang", "round_robin"),
    Target("sglang", "cache_aware"),
)


#: SGLang's router: ``smg`` (Shepherd Model Gateway) 1.13.0, the successor of ``sglang-router``.
SGLANG_ROUTER_MODULE = "smg.launch_router"


async def start_sglang_router(policy: str, worker_urls: Sequence[str], paths: DemoPaths,
                              timeout_s: float = 30.0) -> tuple[ManagedProcess, str]:
    """Start SGLang's router (:data:`SGLANG_ROUTER_MODULE`) on a free loopback port; wait for
    ``GET /health`` = 200.

    Logging is at ``warn`` so that per-request log lines do not cost CPU; its
    Prometheus listener is bound to loopback on a free port (its default is
    ``0.0.0.0:29000``). Returns the process and its base URL; raises
    :class:`sim.procs.ProcessStartError` otherwise.
    """
    port = free_port()
    cmd = python_module_cmd(SGLANG_ROUTER_MODULE, "--worker-urls", *worker_urls, "--policy", policy,
                            "--host", "127.0.0.1", "--port", str(port), "--log-level", "warn",
                            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port()))
    proc = start_process(f"sglang-{policy}", cmd, paths.logs)
    base = f"http://127.0.0.1:{port}"
    try:
        await wait_for_url(f"{base}/health", timeout_s=timeout_s, proc=proc)
    except BaseException:
        stop_process(proc)
        raise
    return proc, base


async def start_target(target: Target, replicas: Sequence[dict[str, str]], tenants: Sequence[str],
                       paths: DemoPaths, spec: ClusterSpec) -> tuple[ManagedProcess, str]:
    """Start ``target`` in front of ``replicas``; return its process and base URL."""
    if target.kind == "sglang":
        return await start_sglang_router(target.policy, [r["url"] for r in replicas], paths)
    cfg = gateway_config(target.policy, replicas, tenants, paths, listen_port=free_port(), admin_port=free_port(),
                         block_size=spec.block_size, index_capacity_blocks=spec.capacity_blocks)
    return await start_gateway(f"gateway-{target.policy}", cfg, paths)


def synthetic_requests(rate_rps: float, duration_s: float, start_id: int) -> list[TraceRequest]:
    """Fixed-rate small requests: one 512-token trace block each (32 simulator tokens), unique
    prefixes (hash ids from ``start_id``), one output token; timestamps in seconds."""
    n = max(1, int(rate_rps * duration_s))
    return [TraceRequest(i, i / rate_rps, 512, 1, (start_id + i,)) for i in range(n)]


@dataclasses.dataclass
class OverheadResult:
    """Router overhead figures (milliseconds, requests/s).

    ``ttft_p50_ms``/``ttft_p99_ms`` at the low rate; ``added_p50_ms``/
    ``added_p99_ms`` minus the direct path; ``steps`` the rate steps tried
    with their p99 added latency and errors; ``max_sustained_rps`` the highest
    passing step (``None`` if even the first failed).
    """

    label: str
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    added_p50_ms: float | None = None
    added_p99_ms: float | None = None
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    max_sustained_rps: float | None = None


def _ttfts_ms(res: ReplayResult) -> list[float]:
    return [r.ttft_s * 1000.0 for r in res.ok if r.ttft_s is not None]


async def _fixed_rate(base: str, rate: float, duration_s: float, start_id: int,
                      headers_for: HeadersFor | None) -> ReplayResult:
    reqs = synthetic_requests(rate, duration_s, start_id)
    cfg = ReplayConfig(base_url=base, time_scale=1.0, concurrency=2048, request_timeout_s=30.0,
                       total_timeout_s=duration_s + 60.0)
    return await replay(reqs, cfg, ["tenant-a"] * len(reqs), headers_for=headers_for,
                        salt_for=None if headers_for else (lambda t: t))


async def measure_overhead(
    label: str, base: str, headers_for: HeadersFor | None, *, low_rps: float, low_s: float,
    steps: Sequence[float], step_s: float, direct: OverheadResult | None, id_base: int,
    log: Callable[[str], None],
) -> OverheadResult:
    """Measure one target's low-rate TTFT and its highest sustained rate (see module doc)."""
    low = await _fixed_rate(base, low_rps, low_s, id_base, headers_for)
    t = _ttfts_ms(low)
    out = OverheadResult(label, percentile(t, 50), percentile(t, 99))
    if direct is not None and out.ttft_p50_ms is not None and direct.ttft_p50_ms is not None:
        out.added_p50_ms = out.ttft_p50_ms - direct.ttft_p50_ms
        out.added_p99_ms = (out.ttft_p99_ms or 0.0) - (direct.ttft_p99_ms or 0.0)
    direct_p99 = {st["rps"]: st.get("p99_ttft_ms") for st in direct.steps} if direct is not None else {}
    # 2x the low-rate p99 added latency; floor 1 ms so that noise on a tiny (or negative) figure
    # does not fail a step by itself
    limit = 2.0 * max(out.added_p99_ms if out.added_p99_ms is not None else (out.ttft_p99_ms or 0.0), 1.0)
    if low.errors_by_kind():
        out.steps.append({"rps": low_rps, "errors": low.errors_by_kind(), "p99_added_ms": None, "pass": False})
        return out
    for i, rps in enumerate(steps):
        res = await _fixed_rate(base, rps, step_s, id_base + 1_000_000 * (i + 1), headers_for)
        tt = _ttfts_ms(res)
        p99 = percentile(tt, 99)
        # added latency at this rate: minus the direct path at the same rate (or at the low rate)
        ref = direct_p99.get(rps) or (direct.ttft_p99_ms if direct is not None else 0.0) or 0.0
        added = None if p99 is None else p99 - ref
        errors = res.errors_by_kind()
        late = percentile([r.late_s for r in res.records], 99) or 0.0
        ok = not errors and added is not None and added <= limit
        out.steps.append({"rps": rps, "errors": errors, "p99_ttft_ms": p99, "p99_added_ms": added,
                          "limit_ms": limit, "client_late_p99_s": late, "pass": ok})
        log(f"    {label:24s} {rps:6.0f} rps: p99 TTFT {p99 or 0:.1f} ms, errors {sum(errors.values())} "
            f"-> {'pass' if ok else 'fail'}")
        if not ok:
            break
        out.max_sustained_rps = rps
    return out


def _parse(argv: Sequence[str] | None) -> SimpleNamespace:
    ap = ClickOptions(prog="python -m sim.bench", description="PrefixGate vs SGLang router benchmark.")
    ap.option("--trace", type=click.Path(path_type=Path), default=DEFAULT_TRACE_PATH)
    ap.option("--rows", type=int, default=2000)
    ap.option("--time-scale", type=float, default=8.0, help="trace seconds per wall second")
    ap.option("--replicas", type=int, default=6)
    ap.option("--capacity-blocks", type=int, default=4000)
    ap.option("--prefill-tokens-per-s", type=float, default=10000.0)
    ap.option("--tenants", type=int, default=1)
    ap.option("--runs", type=int, default=3)
    ap.option("--seed", type=int, default=0)
    ap.option("--targets", default=",".join(t.label for t in TARGETS))
    ap.option("--skip-trace", is_flag=True, help="only the overhead part")
    ap.option("--skip-overhead", is_flag=True, help="only the trace part")
    ap.option("--low-rps", type=float, default=20.0)
    ap.option("--low-s", type=float, default=30.0)
    ap.option("--steps", default="50,100,200,400", help="rate steps (requests/s)")
    ap.option("--step-s", type=float, default=30.0)
    ap.option("--out", type=click.Path(path_type=Path), default=RESULTS_DIR)
    ap.option("--name", default="bench")
    return ap.parse(argv)


def _targets(spec: str) -> list[Target]:
    out = []
    for item in spec.split(","):
        kind, _, policy = item.strip().partition("/")
        if kind not in ("prefixgate", "sglang") or not policy:
            raise SystemExit(f"bad target {item!r} (use prefixgate/POLICY or sglang/POLICY)")
        out.append(Target(kind, policy))
    return out


async def run_trace_part(args: SimpleNamespace, targets: Sequence[Target], paths: DemoPaths, issuer: Any,
                         log: Callable[[str], None]) -> tuple[list[RouterSummary], dict[str, list[dict[str, Any]]]]:
    """Part 1: ``args.runs`` interleaved runs of every target; returns medians and every run."""
    spec = ClusterSpec(replicas=args.replicas, capacity_blocks=args.capacity_blocks,
                       prefill_tokens_per_s=args.prefill_tokens_per_s, time_scale=args.time_scale)
    reqs = load_mooncake(args.trace, args.rows)
    names = tenant_names(args.tenants)
    headers_for = bearer_headers(issuer, names)
    cluster, replicas = await start_cluster_proc(spec, paths)
    urls = [r["url"] for r in replicas]
    per_target: dict[str, list[RouterSummary]] = {t.label: [] for t in targets}
    try:
        for run in range(args.runs):
            seed = args.seed + run
            tenants = assign_tenants(reqs, names, seed)
            bounds = compute_bounds(reqs, replicas=spec.replicas, capacity_blocks=spec.capacity_blocks,
                                    block_size=spec.block_size, tenants=names, seed=seed)
            rcfg = ReplayConfig(base_url="", time_scale=spec.time_scale, seed=seed,
                                total_timeout_s=3 * reqs[-1].timestamp / spec.time_scale + 120)
            for target in targets:
                t0 = time.monotonic()
                proc, base = await start_target(target, replicas, names, paths, spec)
                try:
                    summary, _ = await run_target(
                        target.label, base, urls, reqs, tenants, rcfg, bounds,
                        headers_for=headers_for if target.kind == "prefixgate" else None,
                        salt_for=(lambda t: t) if target.kind == "sglang" else None,
                    )
                finally:
                    stop_process(proc)
                per_target[target.label].append(summary)
                log(f"  run {run + 1}/{args.runs} {target.label:24s} hit {summary.hit_rate or 0:.3f} "
                    f"TTFT p50 {summary.ttft_p50 or 0:.3f} p99 {summary.ttft_p99 or 0:.3f} "
                    f"errors {sum(summary.errors.values())} ({time.monotonic() - t0:.0f} s)")
    finally:
        stop_process(cluster)
    medians = [median_summary(v) for v in per_target.values() if v]
    return medians, {k: [dataclasses.asdict(s) for s in v] for k, v in per_target.items()}


async def run_overhead_part(args: SimpleNamespace, targets: Sequence[Target], paths: DemoPaths, issuer: Any,
                            log: Callable[[str], None]) -> list[OverheadResult]:
    """Part 2: direct path first, then every target (see module doc)."""
    spec = ClusterSpec(replicas=args.replicas, capacity_blocks=args.capacity_blocks,
                       prefill_tokens_per_s=args.prefill_tokens_per_s, time_scale=1000.0, stream_chunk_tokens=16)
    headers_for = bearer_headers(issuer, ["tenant-a"])
    steps = [float(s) for s in args.steps.split(",") if s.strip()]
    kw = dict(low_rps=args.low_rps, low_s=args.low_s, steps=steps, step_s=args.step_s, log=log)
    cluster, replicas = await start_cluster_proc(spec, paths)
    out: list[OverheadResult] = []
    try:
        direct = await measure_overhead("direct (one replica)", replicas[0]["url"], None, direct=None,
                                        id_base=10_000_000, **kw)
        direct.added_p50_ms = direct.added_p99_ms = 0.0
        out.append(direct)
        for i, target in enumerate(targets):
            proc, base = await start_target(target, replicas, ["tenant-a"], paths, spec)
            try:
                out.append(await measure_overhead(
                    target.label, base, headers_for if target.kind == "prefixgate" else None,
                    direct=direct, id_base=100_000_000 * (i + 1), **kw))
            finally:
                stop_process(proc)
    finally:
        stop_process(cluster)
    return out


def render_overhead(rows: Sequence[OverheadResult]) -> str:
    """Markdown table of the overhead part."""
    def f(v: float | None, fmt: str = ".2f") -> str:
        return "-" if v is None else format(v, fmt)

    lines = ["## Router overhead (small prompts, replica service time ~0)", "",
             "| path | TTFT p50 (ms) | TTFT p99 (ms) | added p50 (ms) | added p99 (ms) | highest sustained rate (req/s) |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        sustained = f(r.max_sustained_rps, ".0f") if r.max_sustained_rps is not None else "< first step"
        lines.append(f"| {r.label} | {f(r.ttft_p50_ms)} | {f(r.ttft_p99_ms)} | {f(r.added_p50_ms)} "
                     f"| {f(r.added_p99_ms)} | {sustained} |")
    lines.append("")
    lines.append("Wall milliseconds. Sustained = highest step with no errors and p99 added latency at most 2x "
                 "its low-rate value (floor 1 ms); added = minus the direct path at the same rate; client and servers share 2 cores, so it is a lower bound.")
    return "\n".join(lines) + "\n"


async def run_bench(args: SimpleNamespace, log: Callable[[str], None] = print) -> Path:
    """Run both parts and write ``bench.md``/``bench.json``; return the Markdown path."""
    targets = _targets(args.targets)
    work = Path(tempfile.mkdtemp(prefix="prefixgate-bench-"))
    paths = DemoPaths.under(work)
    issuer = prepare_identity(paths)
    t0 = time.monotonic()
    medians: list[RouterSummary] = []
    runs: dict[str, list[dict[str, Any]]] = {}
    overhead: list[OverheadResult] = []
    try:
        if not args.skip_trace:
            log(f"trace part: {args.rows} rows, time scale {args.time_scale:g}, {args.runs} runs x {len(targets)} targets")
            medians, runs = await run_trace_part(args, targets, paths, issuer, log)
        if not args.skip_overhead:
            log("overhead part")
            overhead = await run_overhead_part(args, targets, paths, issuer, log)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    meta = {"rows": args.rows, "replicas": args.replicas, "capacity_blocks": args.capacity_blocks,
            "block_size": 16, "prefill_tokens_per_s": args.prefill_tokens_per_s, "time_scale": args.time_scale,
            "tenants": args.tenants, "runs": args.runs, "seed": args.seed,
            "wall_s": round(time.monotonic() - t0, 1)}
    args.out.mkdir(parents=True, exist_ok=True)
    md = ["# PrefixGate vs SGLang router", ""]
    if medians:
        md.append(render_markdown(medians, f"Mooncake trace, median of {args.runs} runs"))
    if overhead:
        md.append(render_overhead(overhead))
    md.append("Setting: " + ", ".join(f"{k}={v}" for k, v in meta.items()) + "\n")
    mp = args.out / f"{args.name}.md"
    mp.write_text("\n".join(md), encoding="utf-8")
    (args.out / f"{args.name}.json").write_text(json.dumps({
        "meta": meta, "medians": [dataclasses.asdict(m) for m in medians], "runs": runs,
        "overhead": [dataclasses.asdict(o) for o in overhead]}, indent=2) + "\n", encoding="utf-8")
    log(mp.read_text(encoding="utf-8"))
    return mp


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m sim.bench``; returns 0, or 2 if a component failed to start."""
    from sim.procs import ProcessStartError

    args = _parse(argv)
    try:
        asyncio.run(run_bench(args))
    except ProcessStartError as exc:
        print(f"bench failed to start a component: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
