"""Session 16 (helper "routing"): per-request view of where requests wait in one DES cell.

``python -m bench.des_s16_routing_detail --cell "prefill x0.5" --windows 8 [--rules smg_like,ext0]
[--out bench/results/des_s16-routing-detail.md]`` (not part of the tests; deterministic).

Per rule, pooled over ``--windows`` 500-row windows (:func:`sim.des.simulate`'s ``detail_out``):
TTFT and wait (TTFT minus the request's own prefill) at p50 / mean / p90 for all requests, for
*hits* (more than half the prompt cached on some replica) and *misses*; the requests around the
median (TTFT between p40 and p60); the spread of prefill work over the replicas (max/mean and
min/mean per window, averaged); the mean TTFT by arrival decile; the policy's reasons.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from bench.des_s16_routing import HARSH_CELLS, _rule
from sim.click_options import ClickOptions
from sim.des import load_trace, simulate
from sim.des_grid import cell_config
from sim.grid import CELLS

__all__ = ["main", "summarise"]


def _q(values: Sequence[float], p: float) -> float:
    v = sorted(values)
    return v[int((len(v) - 1) * p)]


def summarise(name: str, runs: Sequence[Sequence[dict[str, Any]]]) -> list[str]:
    """Markdown lines of one rule over its windows' ``detail_out`` lists."""
    rows = [x for run in runs for x in run]
    p40, p60 = _q([x["ttft"] for x in rows], 0.4), _q([x["ttft"] for x in rows], 0.6)
    groups = {"all": rows, "hits": [x for x in rows if x["available"] > 0.5 * x["prompt"]],
              "misses": [x for x in rows if x["available"] <= 0.5 * x["prompt"]],
              "around p50": [x for x in rows if p40 <= x["ttft"] <= p60]}
    out = []
    for label, sel in groups.items():
        t = [x["ttft"] for x in sel]
        w = [x["ttft"] - x["prefill"] for x in sel]
        out.append(f"| {name} | {label} | {len(sel)} | {_q(t, .5):.2f} | {statistics.fmean(t):.2f} | {_q(t, .9):.2f} "
                   f"| {_q(w, .5):.2f} | {statistics.fmean(w):.2f} | {statistics.fmean(x['prefill'] for x in sel):.3f} "
                   f"| {statistics.fmean(x['ahead'] for x in sel):.1f} | {statistics.fmean(x['cached'] < x['available'] for x in sel):.3f} |")
    spread_hi, spread_lo = [], []
    for run in runs:
        busy = Counter[str]()
        for x in run:
            busy[x["replica"]] += x["prefill"]
        mean = sum(busy.values()) / 6
        spread_hi.append(max(busy.values()) / mean)
        spread_lo.append(min(busy.values()) / mean if len(busy) == 6 else 0.0)
    deciles = []
    for k in range(10):
        deciles.append(statistics.fmean(x["ttft"] for run in runs for x in run[k * len(run) // 10:(k + 1) * len(run) // 10]))
    reasons = Counter(x["reason"] for x in rows).most_common()
    out.append(f"| {name} | replica work max/mean {statistics.fmean(spread_hi):.3f}, min/mean "
               f"{statistics.fmean(spread_lo):.3f}; TTFT mean by arrival decile: "
               f"{' '.join(f'{d:.1f}' for d in deciles)}; reasons: {', '.join(f'{r} {n}' for r, n in reasons)} "
               "| | | | | | | | | |")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rules on the cell's windows and write the table to ``--out``."""
    ap = ClickOptions(prog="python -m bench.des_s16_routing_detail", description=__doc__.splitlines()[0])
    ap.option("--cell", default="prefill x0.5")
    ap.option("--windows", type=int, default=8)
    ap.option("--rules", default="smg_like,ext0")
    ap.option("--out", type=click.Path(path_type=Path), default=Path("bench/results/des_s16-routing-detail.md"))
    args = ap.parse(argv)
    cell = next((c for c in CELLS + HARSH_CELLS if c.name == args.cell), None)
    if cell is None:
        raise click.BadParameter(f"unknown cell: {args.cell}")
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    if any(_rule(r) is None for r in rules):
        raise click.BadParameter("unknown rule")
    cfg = cell_config(cell)
    trace = load_trace(rows=500 * args.windows)
    lines = [f"{cell.name}: {args.windows} windows x 500 rows, pooled (bench.des_s16_routing_detail, DES); wait = "
             "TTFT - own prefill; ahead = requests before it on its replica at dispatch; lost = share served "
             "with less cache than available", "",
             "| rule | requests | n | TTFT p50 | TTFT mean | TTFT p90 | wait p50 | wait mean | own prefill mean "
             "| ahead mean | lost |", "|" + "---|" * 11]
    for name in rules:
        runs = []
        for w in range(args.windows):
            reqs = trace[w * 500:(w + 1) * 500]
            t0 = reqs[0].arrival
            reqs = [dataclasses.replace(r, arrival=r.arrival - t0) for r in reqs]
            detail: list[dict[str, Any]] = []
            simulate(name, _rule(name)(cfg.replica_model), reqs, cfg, detail_out=detail)  # type: ignore[misc]
            runs.append(detail)
        lines += summarise(name, runs)
    text = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
