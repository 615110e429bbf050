"""Offline robustness sweep (issue 15): the routing rule on both replica models and several settings.

``python -m sim.des_sweep [--rows 2000] [--out bench/results/des_sweep.md]``
(not part of the tests). One factor at a time around the DES default (6
replicas, 4000 blocks, 10k real tokens/s prefill) on each replica model
(``fifo``, ``chunked``): prefill x0.5 and x2, KV x0.5 and x2. In each
setting: the SGLang imitation (:class:`sim.des.SGLangLikePolicy`), the
default ``cache_aware`` (calibrated) and ``cache_aware`` with
``calibrate: false`` (the rule before issue 15). Ratios are against the SGLang
imitation in the same setting. The DES has no gateway overhead and no time
scale; it ranks rules, it does not predict the HTTP grid (``sim.grid``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from routing.policies import build_policy
from sim.click_options import ClickOptions
from sim.des import SGLangLikePolicy, SimConfig, load_trace, pooled_bound, simulate, write_setting_table

__all__ = ["SETTINGS", "main", "run_setting"]

#: (replica model, prefill real tokens/s, KV blocks per replica)
SETTINGS: tuple[tuple[str, float, int], ...] = tuple(
    (model, rate, kv)
    for model in ("fifo", "chunked")
    for rate, kv in ((10000.0, 4000), (5000.0, 4000), (20000.0, 4000), (10000.0, 2000), (10000.0, 8000))
)

VARIANTS = {"cache_aware (default)": {}, "cache_aware calibrate=false": {"calibrate": False}}


def run_setting(args: tuple[tuple[str, float, int], int]) -> list[str]:
    """Markdown rows of one setting: the SGLang imitation, then each variant."""
    (model, rate, kv), rows = args
    cfg = SimConfig(replica_model=model, prefill_tokens_per_s=rate, capacity_blocks=kv)
    reqs = load_trace(rows=rows)
    pooled = pooled_bound(reqs, kv * cfg.replicas)
    results = [("sglang_like", simulate("sglang_like", SGLangLikePolicy(), reqs, cfg))]
    results += [(n, simulate(n, build_policy("cache_aware", p), reqs, cfg)) for n, p in VARIANTS.items()]
    sg = results[0][1]
    out = []
    for name, r in results:
        out.append(f"| {model} | x{rate / 10000:g} | x{kv / 4000:g} | {name} | {r.ttft_p50:.3f} | {r.ttft_p90:.3f} "
                   f"| {r.ttft_p99:.3f} | {r.hit_rate / pooled:.3f} | {r.req_imbalance:.2f} "
                   f"| {r.ttft_p50 / sg.ttft_p50:.2f} | {r.ttft_p90 / sg.ttft_p90:.2f} | {r.ttft_p99 / sg.ttft_p99:.2f} |")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Run every setting (2 processes) and write the table to ``--out``."""
    ap = ClickOptions(prog="python -m sim.des_sweep", description=__doc__.splitlines()[0])
    ap.option("--rows", type=int, default=2000)
    ap.option("--out", type=click.Path(path_type=Path), default=Path("bench/results/des_sweep.md"))
    args = ap.parse(argv)
    head = [f"rows={args.rows} replicas=6 (sim.des_sweep); ratios vs sglang_like in the same setting", "",
            "| model | prefill | KV | policy | TTFT p50 s | p90 | p99 | hit/pooled | req max/mean "
            "| p50 ratio | p90 ratio | p99 ratio |", "|" + "---|" * 12]
    print(write_setting_table(head, run_setting, [(s, args.rows) for s in SETTINGS], args.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
