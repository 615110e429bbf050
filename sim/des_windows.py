"""Windowed DES sweep (issue 15): the grid's 500-row figures, over several trace windows.

``python -m sim.des_windows [--windows 8] [--rows 500] [--variant NAME=JSON ...]
[--out bench/results/des_windows.md]`` (not part of the tests).

The live grid (``sim.grid``) replays the first 500 Mooncake rows; request
max/mean over 500 rows (≈ 83 requests per replica) moves by several hundredths
with any small change of placement, so one 500-row run cannot tell a rule's
effect from its luck. This sweep replays ``--windows`` consecutive windows of
``--rows`` rows each (arrivals shifted to start at 0) through the DES, for the
SGLang imitation and each ``cache_aware`` variant, in the settings of
:mod:`sim.des_sweep` plus decode off, and reports per setting and rule: mean
and max request max/mean over the windows, how many windows exceed 1.2, the
mean and min hit rate over the pooled-cache bound and the mean TTFT p50 ratio
against the SGLang imitation in the same window. Rules are compared on the
same windows, so a difference that holds over most windows is the rule's.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from routing.policies import build_policy
from sim.click_options import ClickOptions
from sim.des import SGLangLikePolicy, SimConfig, load_trace, pooled_bound, simulate, write_setting_table

__all__ = ["SETTINGS", "main", "run_setting"]

#: (replica model, label, SimConfig overrides)
SETTINGS: tuple[tuple[str, str, dict[str, Any]], ...] = tuple(
    (model, label, kw)
    for model in ("fifo", "chunked")
    for label, kw in (("x1", {}), ("prefill x0.5", {"prefill_tokens_per_s": 5000.0}),
                      ("prefill x2", {"prefill_tokens_per_s": 20000.0}), ("decode off", {"decode_s_per_token": 0.0}),
                      ("kv x0.5", {"capacity_blocks": 2000}))
)

DEFAULT_VARIANTS: dict[str, dict[str, Any]] = {"cache_aware (default)": {}, "calibrate=false": {"calibrate": False}}


def run_setting(args: tuple[tuple[str, str, dict[str, Any]], int, int, dict[str, dict[str, Any]]]) -> list[str]:
    """Markdown rows of one setting: the SGLang imitation, then each variant
    (``{name: cache_aware parameters}``), summarised over the windows."""
    (model, label, kw), windows, rows, variants = args
    cfg = SimConfig(replica_model=model, **kw)
    trace = load_trace(rows=windows * rows)
    per: dict[str, list[tuple[float, float, float]]] = {}
    for w in range(windows):
        reqs = trace[w * rows:(w + 1) * rows]
        t0 = reqs[0].arrival
        reqs = [dataclasses.replace(r, arrival=r.arrival - t0) for r in reqs]
        pooled = pooled_bound(reqs, cfg.capacity_blocks * cfg.replicas)
        sg = simulate("sglang_like", SGLangLikePolicy(), reqs, cfg)
        per.setdefault("sglang_like", []).append((sg.req_imbalance, sg.hit_rate / pooled, 1.0))
        for name, params in variants.items():
            r = simulate(name, build_policy("cache_aware", params), reqs, cfg)
            per.setdefault(name, []).append((r.req_imbalance, r.hit_rate / pooled, r.ttft_p50 / sg.ttft_p50))
    out = []
    for name, vals in per.items():
        mm = [v[0] for v in vals]
        hit = [v[1] for v in vals]
        p50 = [v[2] for v in vals]
        out.append(f"| {model} | {label} | {name} | {sum(mm) / len(mm):.3f} | {max(mm):.2f} "
                   f"| {sum(m > 1.2 for m in mm)}/{len(mm)} | {sum(hit) / len(hit):.3f} | {min(hit):.3f} "
                   f"| {sum(p50) / len(p50):.2f} |")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run every setting (2 processes) and write the table to ``--out``."""
    ap = ClickOptions(prog="python -m sim.des_windows", description=__doc__.splitlines()[0])
    ap.option("--windows", type=int, default=8)
    ap.option("--rows", type=int, default=500)
    ap.option("--variant", multiple=True, default=[],
              help="NAME=JSON cache_aware parameters (default: the default rule and calibrate=false)")
    ap.option("--out", type=click.Path(path_type=Path), default=Path("bench/results/des_windows.md"))
    args = ap.parse(argv)
    variants = dict(DEFAULT_VARIANTS)
    for v in args.variant:
        name, _, params = v.partition("=")
        variants[name] = json.loads(params)
    title = (f"windows={args.windows} x rows={args.rows} replicas=6 (sim.des_windows); "
             "p50 ratio vs sglang_like in the same window")
    columns = ("| model | setting | rule | max/mean mean | max/mean max | windows > 1.2 | hit/pooled mean "
               "| hit/pooled min | p50 ratio mean |")
    head = [title, "", columns, "|" + "---|" * 9]
    jobs = [(s, args.windows, args.rows, variants) for s in SETTINGS]
    print(write_setting_table(head, run_setting, jobs, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
