"""The robustness grid's ten cells in the offline simulation, against the smg imitation (session 10).

``python -m sim.des_grid [--windows 8] [--rows 500] [--rules smg_like,ext0,ext1] [--out ...]``
(not part of the tests; about a second of CPU per cell and window). Each cell of
:data:`sim.grid.CELLS` becomes a :class:`sim.des.SimConfig` (prefill speed,
decode cost, KV capacity, replica model); 8 tenants salt every block key with
the request's tenant (:func:`sim.trace.assign_tenants`, seeds 0, 1, 2 as the
grid's three runs; medians over the seeds), so tenants never share blocks, as
with the gateway's per-tenant HMAC chains and smg's ``cache_salt``. The time
scale changes nothing here (the DES has no gateway or HTTP latency, which is
what the time scale stretches): the two time-scale-20 cells equal their
time-scale-8 neighbours and are listed for completeness.

Windows: ``--windows`` consecutive ``--rows``-row slices of the Mooncake trace;
window 0 is the grid's own rows. Per cell and rule it reports window 0's
figures and, over all windows, how many meet each of the grid's four per-cell
criteria (:func:`sim.grid.render_verdicts`): hit rate >= 0.95 of the pooled
bound, TTFT p50 below ``smg_like``'s, p99 <= 1.05x ``smg_like``'s, request
max/mean <= 1.2 (1e-9 tolerance), and which windows miss which criterion (session 11).

Rules: ``smg_like`` (:class:`sim.des_smg.SMGLikePolicy`); ``extW``: PrefixGate's
``cache_aware`` with ``queue_externality_weight: W`` (W 0, 0.5, 1, 2; ``ext0`` is
the default); ``rsv_extW``: the same with ``dispatch_share_reserve_next_turn``
(session 11, :data:`RESERVE_RULES`; not run by default); ``wb_extW``, ``rsv_wb_extW``: the same
with ``queue_externality_work_balance`` (session 12, :data:`WORK_BALANCE_RULES`; not run by default).
bench/results/des_grid-s10.md was written on branch ``s10-grid``, whose
dispatch-share guard rounded its capacity down (not merged): there its ``ceil_extW`` rows are
main's shipped rule (capacity rounded up) and its ``extW`` rows the candidate.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click

from routing.policies import build_policy
from sim.click_options import ClickOptions
from sim.des import SimConfig, SimRequest, load_trace, pooled_bound, simulate, write_setting_table
from sim.des_smg import SMGLikePolicy
from sim.grid import CELLS, Cell
from sim.bounds import tenant_names
from sim.trace import DEFAULT_TRACE_PATH, assign_tenants, load_mooncake

__all__ = ["ALL_RULES", "KNOWN_RULES", "RESERVE_RULES", "RULES", "WORK_BALANCE_RULES", "cell_config", "criteria", "main", "run_cell", "salted"]


def _ca(**params: Any) -> Callable[[str], Any]:
    return lambda model: build_policy("cache_aware", params)


#: rule name -> factory(replica model) of a routing policy
RULES: dict[str, Callable[[str], Any]] = {
    "smg_like": lambda model: SMGLikePolicy(model),
    "ext0": _ca(),
    "ext0.5": _ca(queue_externality_weight=0.5),
    "ext1": _ca(queue_externality_weight=1.0),
    "ext2": _ca(queue_externality_weight=2.0),
}

#: session 11: the dispatch-share guard's placements leave room for their own next turn
RESERVE_RULES: dict[str, Callable[[str], Any]] = {
    "rsv_ext0": _ca(dispatch_share_reserve_next_turn=True),
    "rsv_ext0.5": _ca(dispatch_share_reserve_next_turn=True, queue_externality_weight=0.5),
}
#: session 12: the externality counts a replica's waiting requests at least as its share of the queued work
#: (``queue_externality_work_balance``; :func:`routing.scorers.queue_externality.work_equivalent_requests`)
WORK_BALANCE_RULES: dict[str, Callable[[str], Any]] = {
    **{f"wb_ext{w:g}": _ca(queue_externality_weight=w, queue_externality_work_balance=True) for w in (0.5, 1.0)},
    **{f"rsv_wb_ext{w:g}": _ca(dispatch_share_reserve_next_turn=True, queue_externality_weight=w,
                                queue_externality_work_balance=True) for w in (0.5, 0.75, 1.0, 1.5, 2.0)},
}
ALL_RULES: dict[str, Callable[[str], Any]] = {**RULES, **RESERVE_RULES}
#: every rule ``--rules`` accepts
KNOWN_RULES: dict[str, Callable[[str], Any]] = {**ALL_RULES, **WORK_BALANCE_RULES}

_FIGS = ("p50", "p99", "hit_pooled", "req_mm")


def cell_config(cell: Cell) -> SimConfig:
    """The DES setting of one grid cell (module doc: the time scale and tenants are not in it)."""
    return SimConfig(prefill_tokens_per_s=cell.prefill_tokens_per_s, decode_s_per_token=cell.decode_s_per_token,
                     capacity_blocks=cell.capacity_blocks, replica_model=cell.replica_model)


def salted(reqs: Sequence[SimRequest], tenants: Sequence[str]) -> list[SimRequest]:
    """``reqs`` with every block key re-hashed under its request's tenant (parallel ``tenants``):
    a chain per tenant, so different tenants never match each other's blocks."""
    out = []
    for r, t in zip(reqs, tenants, strict=True):
        salt = t.encode()
        out.append(dataclasses.replace(r, keys=tuple(hashlib.blake2b(salt + k, digest_size=16).digest()
                                                     for k in r.keys), tenant=t))
    return out


def criteria(fig: dict[str, float], smg: dict[str, float]) -> tuple[bool, bool, bool, bool]:
    """The grid's four per-cell criteria of ``fig`` against ``smg`` (keys of ``_FIGS``): hit/pooled >= 0.95,
    p50 < smg's, p99 <= 1.05x smg's, request max/mean <= 1.2 (+1e-9)."""
    return (fig["hit_pooled"] >= 0.95, fig["p50"] < smg["p50"], fig["p99"] <= 1.05 * smg["p99"],
            fig["req_mm"] <= 1.2 + 1e-9)


def _window(cell: Cell, reqs: list[SimRequest], rows_meta: Sequence[Any], rules: Sequence[str]) -> dict[str, dict[str, float]]:
    """Figures of every rule on one window (medians over the tenant seeds when ``cell.tenants > 1``)."""
    cfg = cell_config(cell)
    t0 = reqs[0].arrival
    reqs = [dataclasses.replace(r, arrival=r.arrival - t0) for r in reqs]
    seeds = (0, 1, 2) if cell.tenants > 1 else (0,)
    per: dict[str, list[dict[str, float]]] = {r: [] for r in rules}
    for seed in seeds:
        run = reqs
        if cell.tenants > 1:
            run = salted(reqs, assign_tenants(rows_meta, tenant_names(cell.tenants), seed))
        pooled = pooled_bound(run, cfg.capacity_blocks * cfg.replicas)
        for name in rules:
            res = simulate(name, KNOWN_RULES[name](cfg.replica_model), run, cfg)
            per[name].append({"p50": res.ttft_p50, "p99": res.ttft_p99, "hit_pooled": res.hit_rate / pooled,
                              "req_mm": res.req_imbalance})
    return {n: {f: statistics.median(d[f] for d in v) for f in _FIGS} for n, v in per.items()}


def run_cell(args: tuple[Cell, int, int, Sequence[str]]) -> list[str]:
    """Markdown rows of one cell, one per rule (``smg_like`` is always run, first)."""
    cell, windows, rows, rules = args
    rules = ["smg_like", *[r for r in rules if r != "smg_like"]]
    trace = load_trace(rows=windows * rows)
    meta = load_mooncake(DEFAULT_TRACE_PATH, windows * rows)
    wins = [_window(cell, trace[w * rows:(w + 1) * rows], meta[w * rows:(w + 1) * rows], rules)
            for w in range(windows)]
    lines = []
    for name in rules:
        f0, s0 = wins[0][name], wins[0]["smg_like"]
        ok = [criteria(w[name], w["smg_like"]) for w in wins]
        met = [sum(o[k] for o in ok) for k in range(4)]
        all4 = sum(all(o) for o in ok)
        p50r = statistics.fmean(w[name]["p50"] / w["smg_like"]["p50"] for w in wins)
        p99r = statistics.fmean(w[name]["p99"] / w["smg_like"]["p99"] for w in wins)
        mm_max = max(w[name]["req_mm"] for w in wins)
        hit_min = min(w[name]["hit_pooled"] for w in wins)
        v0 = "yes" if all(criteria(f0, s0)) else "**no**"
        misses = " ".join(f"{w}{''.join(k for k, o in zip('HPQM', ok[w]) if not o)}"
                          for w in range(windows) if not all(ok[w])) or "-"
        lines.append(
            f"| {cell.name} | {name} | {f0['p50']:.2f} | {f0['p50'] / s0['p50']:.2f} | {f0['p99'] / s0['p99']:.2f} "
            f"| {f0['hit_pooled']:.3f} | {f0['req_mm']:.3f} | {v0} | {p50r:.2f} | {p99r:.2f} | {hit_min:.3f} | {mm_max:.3f} "
            f"| {'/'.join(map(str, met))} | {all4}/{windows} | {misses} |")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run every cell (2 processes) and write the table to ``--out``."""
    ap = ClickOptions(prog="python -m sim.des_grid", description=__doc__.splitlines()[0])
    ap.option("--windows", type=int, default=8)
    ap.option("--rows", type=int, default=500)
    ap.option("--rules", default=",".join(RULES), help="comma-separated rule names")
    ap.option("--cells", default="", help="semicolon-separated cell names (default: all)")
    ap.option("--out", type=click.Path(path_type=Path), default=Path("bench/results/des_grid.md"))
    args = ap.parse(argv)
    rules = [r.strip() for r in args.rules.split(",") if r.strip()]
    unknown = [r for r in rules if r not in KNOWN_RULES]
    if unknown:
        raise click.BadParameter(f"unknown rules: {', '.join(unknown)}")
    want = {c.strip() for c in args.cells.split(";") if c.strip()}
    cells = [c for c in CELLS if not want or c.name in want]
    head = [f"windows={args.windows} x rows={args.rows} replicas=6 (sim.des_grid); window 0 = the grid's rows; "
            "ratios against smg_like; met: windows meeting hit/p50/p99/max-mean; extW: cache_aware with "
            "queue_externality_weight W", "",
            "| cell | rule | w0 p50 (s) | w0 p50 ratio | w0 p99 ratio | w0 hit/pooled | w0 req max/mean "
            "| w0 all four | mean p50 ratio | mean p99 ratio | worst hit/pooled | worst req max/mean | met hit/p50/p99/mm "
            "| all four | windows missing (H hit, P p50, Q p99, M max/mean) |",
            "|" + "---|" * 15]
    jobs = [(c, args.windows, args.rows, tuple(rules)) for c in cells]
    print(write_setting_table(head, run_cell, jobs, args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
