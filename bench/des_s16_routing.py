"""Session 16 (helper "routing"): the grid's cells in the DES at p50, p90 and p99, over trace windows.

``python -m bench.des_s16_routing [--windows 8] [--rows 500] [--rules smg_like,ext0,...] [--harsh]
[--out bench/results/des_s16-routing.md]`` (not part of the tests; deterministic, CPU only).

:mod:`sim.des_grid` reports p50 and p99 only; this sweep adds p90, the harsher prefill settings
``prefill x0.4`` and ``prefill x0.3`` (``--harsh``), and per rule the mean ratio to ``smg_like``
over the windows at each percentile plus the windows in which the rule is worse than
``smg_like`` at p50 / p90 / p99. Each cell is :func:`sim.des_grid.cell_config` of its
:class:`sim.grid.Cell`; 8 tenants: median over tenant seeds 0, 1, 2 (as ``sim.des_grid``).
Rules: :data:`sim.des_grid.KNOWN_RULES` plus :data:`EXTRA_RULES` (the candidates of this session).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from routing.policies import build_policy
from sim.bounds import tenant_names
from sim.click_options import ClickOptions
from sim.des import SimRequest, load_trace, pooled_bound, simulate, write_setting_table
from sim.des_grid import KNOWN_RULES, cell_config, salted
from sim.grid import CELLS, Cell
from sim.trace import DEFAULT_TRACE_PATH, assign_tenants, load_mooncake

__all__ = ["EXTRA_RULES", "HARSH_CELLS", "main", "run_cell"]

#: harsher than the grid's prefill x0.5 (question 1 of the session-16 brief)
HARSH_CELLS = (Cell("prefill x0.4", prefill_tokens_per_s=4000.0), Cell("prefill x0.3", prefill_tokens_per_s=3000.0))


def _ca(**params: Any) -> Callable[[str], Any]:
    return lambda model: build_policy("cache_aware", params)


#: candidates of session 16 (filled as they are tried; see docs/benchmarks.md "Session 16: routing")
EXTRA_RULES: dict[str, Callable[[str], Any]] = {}

_FIGS = ("p50", "p90", "p99", "hit_pooled", "req_mm")


def _value(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    return float(text) if "." in text or "e" in text else int(text)


def _rule(name: str) -> Callable[[str], Any] | None:
    """A rule by name: :data:`sim.des_grid.KNOWN_RULES`, :data:`EXTRA_RULES`, or ``ca:key=value+key=value``
    (``cache_aware`` with those parameters; values int, float, true/false, null)."""
    if name in KNOWN_RULES:
        return KNOWN_RULES[name]
    if name in EXTRA_RULES:
        return EXTRA_RULES[name]
    if name.startswith("ca:"):
        params = dict(kv.split("=", 1) for kv in name[3:].split("+") if kv)
        return _ca(**{k: _value(v) for k, v in params.items()})
    return None


def _rules() -> dict[str, Callable[[str], Any]]:
    return {**KNOWN_RULES, **EXTRA_RULES}


def _window(cell: Cell, reqs: list[SimRequest], meta: Sequence[Any], rules: Sequence[str]) -> dict[str, dict[str, float]]:
    cfg = cell_config(cell)
    t0 = reqs[0].arrival
    reqs = [dataclasses.replace(r, arrival=r.arrival - t0) for r in reqs]
    seeds = (0, 1, 2) if cell.tenants > 1 else (0,)
    per: dict[str, list[dict[str, float]]] = {r: [] for r in rules}
    for seed in seeds:
        run = reqs
        if cell.tenants > 1:
            run = salted(reqs, assign_tenants(meta, tenant_names(cell.tenants), seed))
        pooled = pooled_bound(run, cfg.capacity_blocks * cfg.replicas)
        for name in rules:
            res = simulate(name, _rule(name)(cfg.replica_model), run, cfg)  # type: ignore[misc]
            per[name].append({"p50": res.ttft_p50, "p90": res.ttft_p90, "p99": res.ttft_p99,
                              "hit_pooled": res.hit_rate / pooled, "req_mm": res.req_imbalance})
    return {n: {f: statistics.median(d[f] for d in v) for f in _FIGS} for n, v in per.items()}


def run_cell(args: tuple[Cell, int, int, Sequence[str]]) -> list[str]:
    """Markdown rows of one cell, one per rule (``smg_like`` first)."""
    cell, windows, rows, rules = args
    rules = ["smg_like", *[r for r in rules if r != "smg_like"]]
    trace = load_trace(rows=windows * rows)
    meta = load_mooncake(DEFAULT_TRACE_PATH, windows * rows)
    wins = [_window(cell, trace[w * rows:(w + 1) * rows], meta[w * rows:(w + 1) * rows], rules)
            for w in range(windows)]
    lines = []
    for name in rules:
        f0, s0 = wins[0][name], wins[0]["smg_like"]
        ratio = {p: [w[name][p] / w["smg_like"][p] for w in wins] for p in ("p50", "p90", "p99")}
        worse = {p: [i for i, r in enumerate(ratio[p]) if r >= 1.0] for p in ratio}
        gmean = {p: statistics.geometric_mean(ratio[p]) for p in ratio}
        lines.append(
            f"| {cell.name} | {name} | {f0['p50']:.2f} | {f0['p90']:.2f} | {f0['p99']:.2f} "
            f"| {f0['p50'] / s0['p50']:.2f} | {f0['p90'] / s0['p90']:.2f} | {f0['p99'] / s0['p99']:.2f} "
            f"| {gmean['p50']:.3f} | {gmean['p90']:.3f} | {gmean['p99']:.3f} "
            f"| {len(worse['p50'])}/{len(worse['p90'])}/{len(worse['p99'])} "
            f"| {min(w[name]['hit_pooled'] for w in wins):.3f} | {max(w[name]['req_mm'] for w in wins):.3f} "
            f"| {' '.join(map(str, worse['p50'])) or '-'} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run the cells (2 processes) and write the table to ``--out``."""
    ap = ClickOptions(prog="python -m bench.des_s16_routing", description=__doc__.splitlines()[0])
    ap.option("--windows", type=int, default=8)
    ap.option("--rows", type=int, default=500)
    ap.option("--rules", default="smg_like,ext0", help="comma-separated rule names")
    ap.option("--cells", default="", help="semicolon-separated cell names (default: all)")
    ap.option("--harsh", is_flag=True, help="add prefill x0.4 and x0.3")
    ap.option("--processes", type=int, default=2)
    ap.option("--out", type=click.Path(path_type=Path), default=Path("bench/results/des_s16-routing.md"))
    args = ap.parse(argv)
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    unknown = [r for r in rules if _rule(r) is None]
    if unknown:
        raise click.BadParameter(f"unknown rules: {', '.join(unknown)}")
    want = {c.strip() for c in args.cells.split(";") if c.strip()}
    pool = CELLS + (HARSH_CELLS if args.harsh else ())
    cells = [c for c in pool if not want or c.name in want]
    head = [f"windows={args.windows} x rows={args.rows} replicas=6 (bench.des_s16_routing, DES); w0 = window 0 "
            "(the grid's rows); ratios against smg_like in the same window; gmean: geometric mean of the "
            "per-window ratios; worse: windows with ratio >= 1 at p50/p90/p99", "",
            "| cell | rule | w0 p50 s | w0 p90 s | w0 p99 s | w0 p50 ratio | w0 p90 ratio | w0 p99 ratio "
            "| gmean p50 ratio | gmean p90 ratio | gmean p99 ratio | windows worse p50/p90/p99 "
            "| worst hit/pooled | worst req max/mean | windows worse at p50 |",
            "|" + "---|" * 15]
    jobs = [(c, args.windows, args.rows, tuple(rules)) for c in cells]
    print(write_setting_table(head, run_cell, jobs, args.out, processes=args.processes))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
