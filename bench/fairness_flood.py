"""Benchmark: the flood criterion of issue 17 alone, with the gateway's CPU per refused request.

``python -m bench.fairness_flood [--phase-s S] [--runs N] [--out FILE]``

The ``f_within_limit`` and ``flood`` phases of :mod:`bench.fairness` (fifo replica model, the
same workload, bounds and clients: tenant F with 8, then 64 concurrent 100-word streams looping,
``flow.tenant_max_queued_requests`` 8; tenant B one short request per second), interleaved run
by run, each on a fresh gateway child process. Besides B's TTFT p50/p99 (first SSE event at the
client) and F's 429s it reads the gateway process's CPU time (user + system, psutil) over the
measured part of each phase: ``cpu_us_per_refusal`` = (flood CPU - within-limit CPU) / the
flood's extra 429s, the marginal gateway CPU one refused request costs (the served work of both
phases is about the same: the replica is saturated in both). Median of ``--runs`` (3).

Results: ``bench/results/fairness_flood.{json,md}`` (or ``--out``). The machine may be shared:
the figures are noisy; the ratios within one run are what to read.
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

import aiohttp
import psutil

from bench.fairness import FLOW_ON, OPERATOR, TD, _config, _Gateway, _loop, _paced, _pct
from sim.click_options import ClickOptions
from sim.cluster import spawn_cluster
from sim.spiffe_issuer import DemoIssuer

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "bench" / "results" / "fairness_flood.json"
FLOOD = dict(FLOW_ON, tenant_max_queued_requests=8)


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def _phase(tmp: Path, url: str, issuer: DemoIssuer, senders: int, seconds: float) -> dict[str, Any]:
    """F with ``senders`` concurrent looping 100-word streams, B at 1 request/s."""
    async with _Gateway(tmp, _config(tmp, url, issuer, FLOOD, {}), issuer.mint(OPERATOR, "prefixgate-admin", ttl_s=600)) as g:
        assert g.proc is not None
        tok = {t: issuer.mint(f"spiffe://{TD}/{t}/app", "prefixgate", ttl_s=600) for t in ("b", "f")}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                         timeout=aiohttp.ClientTimeout(total=120)) as s:
            warm = time.perf_counter() + 2.0
            stop = warm + seconds
            served: list[tuple[float, int]] = []
            statuses: list[int] = []
            tasks = [asyncio.ensure_future(_loop(stop, s, g.url, tok["f"], 100, 8, served, statuses))
                     for _ in range(senders)]
            await asyncio.sleep(max(0.0, warm - time.perf_counter()))
            cpu0, n0 = _cpu_s(g.proc.pid), statuses.count(429)
            ttfts: list[float] = []
            b_status: list[int] = []
            await _paced(stop, s, g.url, tok["b"], 1.0, 20, ttfts, b_status)
            cpu1, n1 = _cpu_s(g.proc.pid), statuses.count(429)
            await asyncio.gather(*tasks, return_exceptions=True)
    return {"senders": senders, "gateway_cpu_s": round(cpu1 - cpu0, 3), "f_429_measured": n1 - n0,
            "f_429": statuses.count(429), "f_served": len(served),
            "b": {"ttft_p50_ms": _pct(ttfts, 0.5), "ttft_p99_ms": _pct(ttfts, 0.99), "samples": len(ttfts),
                  "errors": sum(1 for x in b_status if x != 200)}}


async def _run(args: SimpleNamespace) -> dict[str, Any]:
    issuer = DemoIssuer(TD)
    with tempfile.TemporaryDirectory(prefix="pg-flood-") as d, \
            spawn_cluster(1, time_scale=4.0, replica_model="fifo", stream_chunk_tokens=4) as cp:
        tmp = Path(d)
        within = await _phase(tmp, cp.urls[0], issuer, 8, args.phase_s)
        flood = await _phase(tmp, cp.urls[0], issuer, 64, args.phase_s)
    extra = max(1, flood["f_429_measured"] - within["f_429_measured"])
    return {"f_within_limit": within, "flood": flood,
            "b_p99_ratio": round((flood["b"]["ttft_p99_ms"] or 0) / (within["b"]["ttft_p99_ms"] or 1), 3),
            "b_p50_ratio": round((flood["b"]["ttft_p50_ms"] or 0) / (within["b"]["ttft_p50_ms"] or 1), 3),
            "cpu_us_per_refusal": round((flood["gateway_cpu_s"] - within["gateway_cpu_s"]) * 1e6 / extra, 1),
            "loadavg": os.getloadavg()}


def main() -> None:
    """Run ``--runs`` interleaved runs and write ``--out`` (.json: every run and the medians; .md)."""
    ap = ClickOptions(description=__doc__.splitlines()[0])
    ap.option("--phase-s", type=float, default=15.0)
    ap.option("--runs", type=int, default=3)
    ap.option("--label", default="")
    ap.option("--out", default=str(DEFAULT_OUT))
    args = ap.parse()
    runs = [asyncio.run(_run(args)) for _ in range(args.runs)]
    keys = ("b_p99_ratio", "b_p50_ratio", "cpu_us_per_refusal")
    med = {k: statistics.median(r[k] for r in runs) for k in keys}
    doc = {"label": args.label, "phase_s": args.phase_s, "median": med, "runs": runs}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    lines = [f"flood criterion {args.label} (median of {len(runs)}; fifo, queue limit 8, F 8 vs 64 senders)", "",
             "| run | B p50/p99 ms, F within limit | B p50/p99 ms, flood | B p99 ratio | F 429s (flood) | "
             "gateway CPU s within / flood | CPU us per refusal | load |", "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(runs, 1):
        w, f = r["f_within_limit"], r["flood"]
        lines.append(f"| {i} | {w['b']['ttft_p50_ms']}/{w['b']['ttft_p99_ms']} | {f['b']['ttft_p50_ms']}/"
                     f"{f['b']['ttft_p99_ms']} | {r['b_p99_ratio']} | {f['f_429_measured']} | {w['gateway_cpu_s']} / "
                     f"{f['gateway_cpu_s']} | {r['cpu_us_per_refusal']} | {r['loadavg'][0]:.2f} |")
    lines.append(f"| median | | | {med['b_p99_ratio']} | | | {med['cpu_us_per_refusal']} | |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
