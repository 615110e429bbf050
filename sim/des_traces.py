"""PrefixGate's routing rule against the smg imitation on other public traces, offline (session 12).

``python -m sim.des_traces [--rows 1500] [--workloads ...] [--loads 0.4,0.7,1.0] [--settings ...]
[--rules smg_like,ext0,rsv_ext0.5] [--seeds 3] [--out bench/results/des_traces-s12.md]``

Every routing evaluation before session 12 used one trace (Mooncake's conversation trace).
This runs the deterministic simulator (:func:`sim.des.simulate`, 6 replicas) on (the workloads
and :func:`scale_to_load` live in :mod:`sim.workloads`, shared with the live grid ``sim.grid``):

* ``mooncake``: the reference (the grid's trace; seed ``s`` = rows ``s*rows ..``);
* ``azure-code`` / ``azure-conv``: the Azure 2023 traces (:mod:`sim.trace_azure`), no shared
  prefixes (pure load balancing; seed ``s`` = rows ``s*rows ..``);
* ``azure-code+sys`` / ``azure-conv+sys``: the same rows with 8 Zipf-weighted tenants, each with a
  4-block (2,048-token) system prompt; a prompt's last block stays its own (the tenant draw is
  seeded; :func:`sim.trace_azure.with_system_prompts`);
* ``servegen``: ServeGen m-large per-client sessions (:func:`sim.trace_servegen.synthesize`,
  16 busiest clients of window 0, seeded).

Load levels: each workload's timestamps are scaled so that its uncached prefill work at the
default speed (0.005 s + tokens / 10,000 per request) over its span is ``load`` times the 6
replicas' capacity (the trace's own burstiness is kept; ``prefill x0.5`` then doubles it).
Settings: cells of :data:`sim.grid.CELLS` by name (:func:`sim.des_grid.cell_config`).
Tenants: the request's tenant is the router's tenant (calibration per tenant); block ids never
collide across tenants in these workloads, so no salting is needed.

Per cell (workload x load x setting) and rule: medians over the seeds of TTFT p50/p99, hit
rate, pooled bound, request and prefill-busy max/mean, and the grid's four criteria on those
medians (:func:`sim.des_grid.criteria`: H hit >= 0.95 pooled, only where the pooled bound is
at least 0.01; P p50 below smg_like's; Q p99 <= 1.05x; M request max/mean <= 1.2), how many
seeds meet all four, and the share of each pick reason (``RouteChoice.reason``) over all seeds.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import click

from routing.policies import build_policy
from sim.click_options import ClickOptions
from sim.des import SimRequest, pooled_bound, simulate, to_sim_request, write_setting_table
from sim.des_grid import ALL_RULES, cell_config, criteria
from sim.grid import CELLS
from sim.workloads import REPLICAS, WORKLOADS, scale_to_load

__all__ = ["LOADS", "SETTINGS", "WORKLOADS", "build_workload", "main", "run_cell", "scale_to_load"]

LOADS = (0.4, 0.7, 1.0)
SETTINGS = ("default", "prefill x0.5", "decode off", "chunked")
HELP = """PrefixGate's routing rule against the smg imitation on other public traces, offline (session 12).

\b
Workloads: mooncake (reference), azure-code / azure-conv (Azure 2023: real arrivals and lengths,
no shared prefixes), azure-code+sys / azure-conv+sys (the same with 8 Zipf tenants, each with a
2,048-token system prompt), servegen (seeded per-client sessions from ServeGen m-large fits).
Each runs at every load level (uncached prefill work / 6 replicas' capacity at 10k tokens/s)
x setting (sim.grid cell names) x seed, 6 replicas, and reports per cell and rule the medians
over the seeds and the grid's four criteria against smg_like (H hit >= 0.95 pooled, P p50 lower,
Q p99 <= 1.05x, M request max/mean <= 1.2). Deterministic; about 80 s of CPU by default."""


@lru_cache(maxsize=64)
def build_workload(name: str, seed: int, rows: int, load: float) -> tuple[SimRequest, ...]:
    """The simulator requests of one workload, seed and load level (module doc)."""
    reqs, tenants = WORKLOADS[name](seed, rows)
    out = []
    for r, t in zip(scale_to_load(reqs, load), tenants, strict=True):
        row = {"timestamp": r.timestamp * 1000.0, "input_length": r.input_length,
               "output_length": r.output_length, "hash_ids": r.hash_ids}
        out.append(dataclasses.replace(to_sim_request(row), tenant=t))
    return tuple(out)


class _Picks:
    """A policy that counts its pick reasons (every other attribute is the wrapped policy's)."""

    def __init__(self, policy: Any) -> None:
        self._policy = policy
        self.reasons: Counter[str] = Counter()

    def choose(self, req: Any, candidates: Any) -> Any:
        choice = self._policy.choose(req, candidates)
        self.reasons[choice.reason or "-"] += 1
        return choice

    def __getattr__(self, name: str) -> Any:
        return getattr(self._policy, name)


def _rule(name: str, extra: dict[str, dict[str, Any]]) -> Callable[[str], Any]:
    if name in extra:
        params = extra[name]
        return lambda model: build_policy("cache_aware", params)
    return ALL_RULES[name]


_FIGS = ("p50", "p99", "hit", "pooled", "hit_pooled", "req_mm", "pf_mm")


def run_cell(args: tuple[str, float, str, int, int, tuple[str, ...], tuple[tuple[str, str], ...]]) -> list[str]:
    """Markdown rows of one cell (workload, load, setting), one per rule; ``smg_like`` first."""
    import json

    workload, load, setting, seeds, rows, rules, extra_items = args
    extra = {k: json.loads(v) for k, v in extra_items}
    rules = ("smg_like", *[r for r in rules if r != "smg_like"])
    cfg = cell_config(next(c for c in CELLS if c.name == setting))
    per: dict[str, list[dict[str, float]]] = {r: [] for r in rules}
    picks: dict[str, Counter[str]] = {r: Counter() for r in rules}
    for seed in range(seeds):
        reqs = build_workload(workload, seed, rows, load)
        pooled = pooled_bound(reqs, cfg.capacity_blocks * cfg.replicas)
        for name in rules:
            pol = _Picks(_rule(name, extra)(cfg.replica_model))
            res = simulate(name, pol, reqs, cfg)  # type: ignore[arg-type]
            picks[name].update(pol.reasons)
            per[name].append({"p50": res.ttft_p50, "p99": res.ttft_p99, "hit": res.hit_rate, "pooled": pooled,
                              "hit_pooled": res.hit_rate / pooled if pooled >= 0.01 else 1.0,
                              "req_mm": res.req_imbalance, "pf_mm": res.prefill_imbalance})
    med = {n: {f: statistics.median(d[f] for d in v) for f in _FIGS} for n, v in per.items()}
    smg = med["smg_like"]
    lines = []
    for name in rules:
        m = med[name]
        ok = criteria(m, smg)
        hit_applies = m["pooled"] >= 0.01
        marks = "".join(k if o else k.lower() for k, o in zip("HPQM", ok) if k != "H" or hit_applies)
        seeds_ok = sum(all(criteria(a, b)) for a, b in zip(per[name], per["smg_like"]))
        total = sum(picks[name].values())
        pick = " ".join(f"{k} {100 * v / total:.0f}%" for k, v in picks[name].most_common(3))
        verdict = "-" if name == "smg_like" else ("yes" if all(ok) else "**no**")
        lines.append(
            f"| {workload} | {load:g} | {setting} | {name} | {m['p50']:.3f} | {m['p99']:.3f} "
            f"| {m['p50'] / smg['p50']:.2f} | {m['p99'] / smg['p99']:.2f} | {m['hit']:.3f} | {m['pooled']:.3f} "
            f"| {m['req_mm']:.3f} | {m['pf_mm']:.2f} | {'-' if name == 'smg_like' else marks} | {verdict} "
            f"| {'-' if name == 'smg_like' else f'{seeds_ok}/{seeds}'} | {pick} |")
    return lines


def summarize(rows: Sequence[str], rules: Sequence[str]) -> list[str]:
    """Per rule: cells meeting all four criteria, and the cells that do not (from ``run_cell`` rows)."""
    out = ["", "| rule | cells meeting all four | cells missing (workload/load/setting: missed criteria) |",
           "|---|---|---|"]
    for name in rules:
        if name == "smg_like":
            continue
        mine = [r.split("|")[1:-1] for r in rows if r.split("|")[4].strip() == name]
        bad = [f"{c[0].strip()}/{c[1].strip()}/{c[2].strip()}: "
               f"{''.join(x.upper() for x in c[12].strip() if x.islower())}"
               for c in mine if c[13].strip() != "yes"]
        out.append(f"| {name} | {len(mine) - len(bad)}/{len(mine)} | {'; '.join(bad) or '-'} |")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run every cell and write the table (every cell, then a per-rule summary) to ``--out``."""
    ap = ClickOptions(prog="python -m sim.des_traces", description=HELP, show_default=True)
    ap.option("--rows", type=int, default=1500, help="requests per seed")
    ap.option("--seeds", type=int, default=3, help="seeds 0..N-1 (trace windows or synthesis seeds)")
    ap.option("--workloads", default=",".join(WORKLOADS), help="comma-separated workload names")
    ap.option("--loads", default=",".join(f"{x:g}" for x in LOADS), help="comma-separated load levels")
    ap.option("--settings", default=";".join(SETTINGS), help="semicolon-separated sim.grid cell names")
    ap.option("--rules", default="smg_like,ext0,rsv_ext0.5", help="comma-separated sim.des_grid rule names")
    ap.option("--extra-rule", "extra_rules", multiple=True,
              help='NAME=JSON: a cache_aware rule with these parameters (repeatable)')
    ap.option("--processes", type=int, default=1, help="worker processes (one per cell at a time)")
    ap.option("--out", type=click.Path(path_type=Path), default=Path("bench/results/des_traces-s12.md"))
    args = ap.parse(argv)
    if any("=" not in e for e in args.extra_rules):
        raise click.BadParameter("--extra-rule takes NAME=JSON")
    extra = dict(e.split("=", 1) for e in args.extra_rules)
    rules = [r.strip() for r in args.rules.split(",") if r.strip()] + list(extra)
    bad = [r for r in rules if r not in ALL_RULES and r not in extra]
    bad += [w for w in args.workloads.split(",") if w not in WORKLOADS]
    bad += [s for s in args.settings.split(";") if s not in {c.name for c in CELLS}]
    if bad:
        raise click.BadParameter(f"unknown names: {', '.join(bad)}")
    loads = [float(x) for x in args.loads.split(",")]
    jobs = [(w, ld, s, args.seeds, args.rows, tuple(rules), tuple(extra.items()))
            for w in args.workloads.split(",") for ld in loads for s in args.settings.split(";")]
    head = [f"sim.des_traces: rows={args.rows} x seeds={args.seeds}, replicas={REPLICAS}; load = uncached prefill "
            "work / capacity at 10k tokens/s; medians over seeds; ratios against smg_like; criteria letters: "
            "H hit >= 0.95 pooled (only where pooled >= 0.01), P p50 < smg_like, Q p99 <= 1.05x, M req max/mean "
            f"<= 1.2 (lower case = missed); extra rules: {extra or '-'}", "",
            "| workload | load | setting | rule | p50 s | p99 s | p50 ratio | p99 ratio | hit | pooled | req max/mean "
            "| prefill max/mean | criteria | all four | seeds all four | picks (top 3 reasons) |",
            "|" + "---|" * 16]
    text = write_setting_table(head, run_cell, jobs, args.out, processes=args.processes)
    table_rows = [ln for ln in text.splitlines()[4:] if ln.startswith("|")]
    summary = summarize(table_rows, rules)
    with open(args.out, "a", encoding="utf-8") as fh:
        fh.write("\n".join(summary) + "\n")
    print(text + "\n".join(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
