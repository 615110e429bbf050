"""Summaries of replay runs and the side-by-side router comparison table.

Inputs: a :class:`sim.replay.ReplayResult` (client-side TTFT/e2e, errors),
each replica's ``GET /sim/stats`` document (server-side prompt and cached
tokens, requests, prefill busy time) and the offline
:class:`sim.bounds.HitRateBounds`. The prefix hit rate is read from the
replicas: ``sum(cached_tokens) / sum(prompt_tokens)`` over all replicas
(token-weighted, as vLLM's ``prefix_cache_hits / prefix_cache_queries``).
All times are trace seconds.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import aiohttp

from sim.bounds import HitRateBounds
from sim.replay import ReplayResult

__all__ = [
    "RouterSummary",
    "percentile",
    "summarize",
    "median_summary",
    "fetch_replica_stats",
    "reset_replicas",
    "render_markdown",
    "write_report",
]


@dataclass
class RouterSummary:
    """One router's run, reduced to the comparison figures.

    Latencies in trace seconds (``None`` when no request succeeded);
    ``hit_rate`` token-weighted from the replicas; ``hit_vs_pooled`` and
    ``hit_vs_oracle`` are ``hit_rate`` divided by the bounds;
    ``requests_max``/``requests_mean`` and ``prefill_busy_max_s``/
    ``prefill_busy_mean_s`` are over replicas (their ratio shows imbalance);
    ``errors`` counts failed requests by kind.
    """

    router: str
    requests: int
    ok: int
    ttft_p50: float | None
    ttft_p90: float | None
    ttft_p99: float | None
    e2e_p50: float | None
    e2e_p99: float | None
    hit_rate: float | None
    pooled_bound: float | None
    oracle_bound: float | None
    hit_vs_pooled: float | None
    hit_vs_oracle: float | None
    requests_max: float
    requests_mean: float
    prefill_busy_max_s: float
    prefill_busy_mean_s: float
    errors: dict[str, int] = field(default_factory=dict)
    runs: int = 1


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated ``q``-th percentile (0..100) of ``values``; ``None`` if empty."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return xs[0]
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def summarize(
    router: str,
    result: ReplayResult,
    replica_stats: Sequence[Mapping[str, Any]],
    bounds: HitRateBounds | None = None,
) -> RouterSummary:
    """Reduce one run to a :class:`RouterSummary`.

    ``replica_stats`` are ``/sim/stats`` documents taken after the run (their
    counters must have been reset before it). The hit rate falls back to the
    client-side usage figures if no replica reported prompt tokens.
    """
    ok = result.ok
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    e2e = [r.e2e_s for r in ok if r.e2e_s is not None]
    prompt = sum(int(s.get("prompt_tokens", 0)) for s in replica_stats)
    cached = sum(int(s.get("cached_tokens", 0)) for s in replica_stats)
    hit = cached / prompt if prompt else result.client_hit_rate()
    reqs = [float(s.get("requests", 0)) for s in replica_stats] or [0.0]
    busy = [float(s.get("prefill_busy_s", 0.0)) for s in replica_stats] or [0.0]
    pooled = bounds.pooled if bounds else None
    oracle = bounds.oracle if bounds else None
    return RouterSummary(
        router=router, requests=len(result.records), ok=len(ok),
        ttft_p50=percentile(ttft, 50), ttft_p90=percentile(ttft, 90), ttft_p99=percentile(ttft, 99),
        e2e_p50=percentile(e2e, 50), e2e_p99=percentile(e2e, 99),
        hit_rate=hit, pooled_bound=pooled, oracle_bound=oracle,
        hit_vs_pooled=_ratio(hit, pooled), hit_vs_oracle=_ratio(hit, oracle),
        requests_max=max(reqs), requests_mean=statistics.fmean(reqs),
        prefill_busy_max_s=max(busy), prefill_busy_mean_s=statistics.fmean(busy),
        errors=result.errors_by_kind(),
    )


def median_summary(runs: Sequence[RouterSummary]) -> RouterSummary:
    """Field-wise median of several runs of one router (errors summed, ``runs`` = count).

    Raises :class:`ValueError` for an empty list or mixed router names.
    """
    if not runs:
        raise ValueError("no runs")
    if len({r.router for r in runs}) != 1:
        raise ValueError("runs of different routers")
    out: dict[str, Any] = {"router": runs[0].router, "runs": len(runs)}
    errors: dict[str, int] = {}
    for r in runs:
        for k, v in r.errors.items():
            errors[k] = errors.get(k, 0) + v
    out["errors"] = errors
    for f in fields(RouterSummary):
        if f.name in out:
            continue
        vals = [getattr(r, f.name) for r in runs if getattr(r, f.name) is not None]
        out[f.name] = statistics.median(vals) if vals else None
    out["requests"] = int(out["requests"])
    out["ok"] = int(out["ok"])
    return RouterSummary(**out)


async def fetch_replica_stats(urls: Sequence[str], timeout_s: float = 10.0) -> list[dict[str, Any]]:
    """GET ``{url}/sim/stats`` of every replica concurrently; raises :class:`aiohttp.ClientError` on failure."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
        async def one(u: str) -> dict[str, Any]:
            async with s.get(f"{u.rstrip('/')}/sim/stats") as resp:
                resp.raise_for_status()
                return dict(await resp.json())
        return list(await asyncio.gather(*(one(u) for u in urls)))


async def reset_replicas(urls: Sequence[str], timeout_s: float = 10.0) -> None:
    """POST ``{url}/sim/reset`` to every replica (clears caches and counters); raises on failure."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as s:
        async def one(u: str) -> None:
            async with s.post(f"{u.rstrip('/')}/sim/reset") as resp:
                resp.raise_for_status()
        await asyncio.gather(*(one(u) for u in urls))


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def _max_mean(mx: float, mean: float, fmt: str) -> str:
    """``max/mean (ratio)``, e.g. ``113/100 (1.13)``: the two per-replica figures and their ratio
    (the balance criterion, at most 1.2 in the grid); ``-`` for the ratio when the mean is 0."""
    return f"{mx:{fmt}}/{mean:{fmt}} ({_f(mx / mean if mean else None, '.2f')})"


def render_markdown(summaries: Sequence[RouterSummary], title: str | None = None) -> str:
    """Render the side-by-side table (one row per router) as GitHub Markdown. The two
    ``max/mean`` columns give the busiest replica's and the per-replica mean figure, then
    their ratio in parentheses (R12-D3)."""
    head = ("| router | ok/req | TTFT p50 | TTFT p90 | TTFT p99 | e2e p50 | e2e p99 | hit rate "
            "| pooled bound | oracle | hit/pooled | req max/mean | prefill busy max/mean (s) | errors |")
    sep = "|" + "---|" * 14
    lines = [f"## {title}", ""] if title else []
    lines += [head, sep]
    for s in summaries:
        errs = ", ".join(f"{k}: {v}" for k, v in sorted(s.errors.items())) or "0"
        lines.append(
            f"| {s.router} | {s.ok}/{s.requests} | {_f(s.ttft_p50, '.3f')} | {_f(s.ttft_p90, '.3f')} "
            f"| {_f(s.ttft_p99, '.3f')} | {_f(s.e2e_p50, '.2f')} | {_f(s.e2e_p99, '.2f')} "
            f"| {_f(s.hit_rate, '.3f')} | {_f(s.pooled_bound, '.3f')} | {_f(s.oracle_bound, '.3f')} "
            f"| {_f(s.hit_vs_pooled, '.2f')} | {_max_mean(s.requests_max, s.requests_mean, '.0f')} "
            f"| {_max_mean(s.prefill_busy_max_s, s.prefill_busy_mean_s, '.1f')} | {errs} |"
        )
    lines.append("")
    lines.append("Times in trace seconds (wall x time scale). Hit rate = sum cached / sum prompt tokens "
                 "over the replicas; bounds from `sim.bounds` on the same rows. max/mean: the busiest "
                 "replica's requests (prefill busy seconds) / the mean over replicas (ratio).")
    return "\n".join(lines) + "\n"


def write_report(
    summaries: Sequence[RouterSummary],
    out_dir: str | Path,
    name: str,
    *,
    title: str | None = None,
    meta: Mapping[str, Any] | None = None,
    extra_markdown: str = "",
) -> tuple[Path, Path]:
    """Write ``out_dir/name.json`` and ``out_dir/name.md``; return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    jp, mp = out / f"{name}.json", out / f"{name}.md"
    jp.write_text(json.dumps({"meta": dict(meta or {}), "routers": [asdict(s) for s in summaries]}, indent=2) + "\n",
                  encoding="utf-8")
    md = render_markdown(summaries, title)
    if meta:
        md += "\nSetting: " + ", ".join(f"{k}={v}" for k, v in meta.items()) + "\n"
    if extra_markdown:
        md += "\n" + extra_markdown
    mp.write_text(md, encoding="utf-8")
    return jp, mp
