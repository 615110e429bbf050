"""sim.grid's verdict table: request max/mean exactly at the 1.2 bound passes, above it fails."""
from __future__ import annotations

import dataclasses

from sim.grid import CELLS, _key, render_verdicts
from sim.report import RouterSummary


def _summary(router: str, requests_max: float) -> RouterSummary:
    return RouterSummary(router=router, requests=500, ok=500, ttft_p50=1.0, ttft_p90=2.0, ttft_p99=3.0,
                         e2e_p50=1.0, e2e_p99=3.0, hit_rate=0.16, pooled_bound=0.16, oracle_bound=0.2,
                         hit_vs_pooled=1.0, hit_vs_oracle=0.8, requests_max=requests_max,
                         requests_mean=500 / 6, prefill_busy_max_s=1.0, prefill_busy_mean_s=1.0)


def _verdict_cell(requests_max: float) -> str:
    cell = CELLS[0]
    cache = {_key(cell, 500, 0, "prefixgate"): dataclasses.asdict(_summary("prefixgate", requests_max)),
             _key(cell, 500, 0, "smg"): dataclasses.asdict(_summary("smg", 90))}
    row = next(line for line in render_verdicts(cache, 500, 1).splitlines() if line.startswith(f"| {cell.name} "))
    return row.split("|")[6]


def test_max_over_mean_exactly_at_the_bound_passes() -> None:
    assert 100 / (500 / 6) > 1.2  # floating point renders the exact 1.2 above the bound
    assert "yes" in _verdict_cell(100)


def test_max_over_mean_above_the_bound_fails() -> None:
    assert "no" in _verdict_cell(101)
