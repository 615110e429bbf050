"""Where the TTFT distribution comes from in the grid's cells, offline (session 9).

``python -m sim.des_overload [--windows 4] [--rows 500] [--out bench/results/des_overload.md]``
(not part of the tests). For each grid cell the DES can model (FIFO and
chunked replicas, prefill x0.5/x1/x2, decode off, KV x0.5/x2; no gateway, no
time scale), over ``--windows`` consecutive ``--rows``-row windows of the
Mooncake trace, 6 replicas, it runs:

* ``smg_like``: the imitation of the router the grid compares against
  (:class:`sim.des_smg.SMGLikePolicy`);
* ``sglang_like``: the older imitation the other DES tools use;
* ``cache_aware``: PrefixGate's default rule;
* ``exact_wait``: ``cache_aware`` with ``calibrate: false``. On FIFO replicas
  of equal speed its estimated TTFT is the true queued work ahead plus the
  uncached prompt (the configured rate only scales all candidates alike), so
  it shows what a perfect queue-time estimate would change;
* ``no_share_guard``: ``cache_aware`` without the dispatch-share guard
  (request max/mean is then not bounded: above the grid's 1.2);
* ``externality``: ``cache_aware`` with ``queue_externality_weight: 1``
  (:mod:`routing.scorers.queue_externality`: each request also pays the delay
  its prefill adds to the requests that will queue behind it);
* ``late_binding_1``, ``late_binding_3``: ``cache_aware`` behind one
  arrival-order queue at the gateway, a request routed only among the
  replicas with fewer than 1 (3) requests before their first byte
  (``SimConfig.hold_prefilling``);
* ``central_fifo``: a reference, not a router: one arrival-order queue in
  front of ``replicas`` servers sharing one pooled cache (every prefix
  cached anywhere is a hit), each request served by the first server free.
  It has no placement loss and keeps the arrival order.

Per rule, means over the windows: TTFT p25, p50, mean, p75, p90, p99; the
share of requests served within 0.5x, 1x and 1.5x of ``cache_aware``'s own
p50 (where the CDFs cross); request and prefill-busy max/mean; hit rate over
the pooled-cache bound; ``overtaken``: the share of request pairs arriving at
least 2 s apart whose later request got its first byte first (0 for a
single FIFO queue with equal service times). The p50 ratio is against
``smg_like`` in the same window.
"""

from __future__ import annotations

import dataclasses
import heapq
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import math

import click

from routing.policies import build_policy
from sim.click_options import ClickOptions
from sim.des import (
    BlockLRU,
    SGLangLikePolicy,
    SimConfig,
    SimRequest,
    load_trace,
    pooled_bound,
    simulate,
    write_setting_table,
)
from sim.des_smg import SMGLikePolicy

__all__ = ["RULES", "SETTINGS", "central_fifo", "main", "overtaken", "run_setting", "summarise"]

#: (label, SimConfig keyword arguments)
SETTINGS: tuple[tuple[str, dict[str, Any]], ...] = tuple(
    (f"{model} {label}", {"replica_model": model, **kw})
    for model in ("fifo", "chunked")
    for label, kw in (("x1", {}), ("prefill x0.5", {"prefill_tokens_per_s": 5000.0}),
                      ("prefill x2", {"prefill_tokens_per_s": 20000.0}), ("decode off", {"decode_s_per_token": 0.0}),
                      ("kv x0.5", {"capacity_blocks": 2000}), ("kv x2", {"capacity_blocks": 8000}))
)

#: rule name -> (factory(replica model), SimConfig overrides); ``central_fifo`` is run apart
RULES: dict[str, tuple[Callable[[str], Any], dict[str, Any]]] = {
    "smg_like": (lambda model: SMGLikePolicy(model), {}),
    "sglang_like": (lambda model: SGLangLikePolicy(), {}),
    "cache_aware": (lambda model: build_policy("cache_aware", {}), {}),
    "exact_wait": (lambda model: build_policy("cache_aware", {"calibrate": False}), {}),
    "no_share_guard": (lambda model: build_policy("cache_aware", {"dispatch_share_factor": None}), {}),
    "externality": (lambda model: build_policy("cache_aware", {"queue_externality_weight": 1.0}), {}),
    "late_binding_1": (lambda model: build_policy("cache_aware", {}), {"hold_prefilling": 1}),
    "late_binding_3": (lambda model: build_policy("cache_aware", {}), {"hold_prefilling": 3}),
    "central_fifo": (lambda model: None, {}),
}

_COLS = ("p25", "p50", "mean", "p75", "p90", "p99", "le_half", "le_p50", "le_1.5", "overtaken", "req_mm", "busy_mm",
         "hit_pooled", "p50_ratio")


def central_fifo(reqs: Sequence[SimRequest], cfg: SimConfig) -> tuple[list[float], float]:
    """The ``central_fifo`` reference (module doc): per-request TTFT (s, in the order of ``reqs``,
    which must be in arrival order) and the token hit rate, with ``cfg.replicas`` servers
    sharing one LRU of ``cfg.replicas · cfg.capacity_blocks`` blocks and FIFO prefill timing."""
    cache = BlockLRU(cfg.capacity_blocks * cfg.replicas)
    free = [0.0] * cfg.replicas
    out: list[float] = []
    hit = total = 0
    for r in reqs:
        start = max(heapq.heappop(free), r.arrival)
        cached = min(cache.match(r.keys) * cfg.block_size, r.prompt_tokens)
        cache.insert(r.keys)
        hit += cached
        total += r.prompt_tokens
        end = start + cfg.prefill_overhead_s + (r.prompt_tokens - cached) * cfg.token_scale / cfg.prefill_tokens_per_s
        heapq.heappush(free, end)
        out.append(end - r.arrival)
    return out, hit / max(1, total)


def overtaken(arrivals: Sequence[float], ttfts: Sequence[float], gap_s: float = 2.0) -> float:
    """Share of pairs (i, j) with ``arrivals[j] - arrivals[i] >= gap_s`` (s; ``arrivals``
    non-decreasing) whose later request had its first byte first; 0.0 with no such pair."""
    fb = [a + t for a, t in zip(arrivals, ttfts)]
    pairs = late = 0
    n = len(fb)
    j0 = 0
    for i in range(n):
        j0 = max(j0, i + 1)
        while j0 < n and arrivals[j0] - arrivals[i] < gap_s:
            j0 += 1
        pairs += n - j0
        fi = fb[i]
        late += sum(1 for j in range(j0, n) if fb[j] < fi)
    return late / pairs if pairs else 0.0


def _q(vals: Sequence[float], p: float) -> float:
    k = (len(vals) - 1) * p / 100.0
    lo = int(k)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (k - lo)


def summarise(ttfts: Sequence[float], ref_p50: float) -> dict[str, float]:
    """Distribution figures of ``ttfts`` (s, any order, non-empty): p25 ... p99, mean, and the
    share of requests with TTFT at most 0.5x, 1x and 1.5x ``ref_p50`` (s, > 0)."""
    v = sorted(ttfts)
    n = len(v)
    return {"p25": _q(v, 25), "p50": _q(v, 50), "mean": statistics.fmean(v), "p75": _q(v, 75), "p90": _q(v, 90),
            "p99": _q(v, 99), "le_half": sum(t <= 0.5 * ref_p50 for t in v) / n,
            "le_p50": sum(t <= ref_p50 for t in v) / n, "le_1.5": sum(t <= 1.5 * ref_p50 for t in v) / n}


def run_setting(args: tuple[tuple[str, dict[str, Any]], int, int, Sequence[str]]) -> list[str]:
    """Markdown rows of one setting, one per rule (``rules`` names of :data:`RULES`, in order),
    each figure the mean over the windows."""
    (label, kw), windows, rows, rules = args
    cfg = SimConfig(**kw)
    trace = load_trace(rows=windows * rows)
    acc: dict[str, list[dict[str, float]]] = {r: [] for r in rules}
    for w in range(windows):
        reqs = trace[w * rows:(w + 1) * rows]
        t0 = reqs[0].arrival
        reqs = [dataclasses.replace(r, arrival=r.arrival - t0) for r in reqs]
        pooled = pooled_bound(reqs, cfg.capacity_blocks * cfg.replicas)
        runs: dict[str, tuple[Any, list[float]]] = {}
        for name in ("smg_like", "cache_aware", *rules):
            if name in runs or name == "central_fifo":
                continue
            make, over = RULES[name]
            out: list[float] = []
            runs[name] = (simulate(name, make(cfg.replica_model), reqs, dataclasses.replace(cfg, **over),
                                   ttft_out=out), out)
        ref = runs["cache_aware"][0].ttft_p50
        smg_p50 = runs["smg_like"][0].ttft_p50
        arrivals = [r.arrival for r in reqs]
        for name in rules:
            if name == "central_fifo":
                out, hit = central_fifo(reqs, cfg)
                extra = {"req_mm": math.nan, "busy_mm": math.nan, "hit_pooled": hit / pooled}
            else:
                res, out = runs[name]
                extra = {"req_mm": res.req_imbalance, "busy_mm": res.prefill_imbalance,
                         "hit_pooled": res.hit_rate / pooled}
            row = summarise(out, ref)
            row.update(extra, overtaken=overtaken(arrivals, out))
            row["p50_ratio"] = row["p50"] / smg_p50
            acc[name].append(row)
    lines = []
    for name in rules:
        mean = {c: statistics.fmean(r[c] for r in acc[name]) for c in _COLS}
        lines.append(f"| {label} | {name} | " + " | ".join(
            f"{mean[c]:.3f}" if c in ("hit_pooled", "overtaken") else f"{mean[c]:.2f}" for c in _COLS) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run every setting (2 processes) and write the table to ``--out``."""
    ap = ClickOptions(prog="python -m sim.des_overload", description=__doc__.splitlines()[0])
    ap.option("--windows", type=int, default=4)
    ap.option("--rows", type=int, default=500)
    ap.option("--settings", default="", help="semicolon-separated setting labels (default: all)")
    ap.option("--out", type=click.Path(path_type=Path), default=Path("bench/results/des_overload.md"))
    args = ap.parse(argv)
    want = {s.strip() for s in args.settings.split(";") if s.strip()}
    settings = [s for s in SETTINGS if not want or s[0] in want]
    head = [f"windows={args.windows} x rows={args.rows} replicas=6 (sim.des_overload); means over the windows; "
            "le_*: share of requests with TTFT <= 0.5x / 1x / 1.5x cache_aware's p50; p50 ratio vs smg_like", "",
            "| setting | rule | " + " | ".join(_COLS) + " |", "|" + "---|" * (len(_COLS) + 2)]
    jobs = [(s, args.windows, args.rows, tuple(RULES)) for s in settings]
    print(write_setting_table(head, run_setting, jobs, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
