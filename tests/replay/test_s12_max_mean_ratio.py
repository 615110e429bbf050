"""R12-D3: the results table's max/mean columns print the ratio beside the two figures, so that
``6/5`` reads as the balance criterion (at most 1.2 in the grid) without doing the division."""
from __future__ import annotations

from dataclasses import replace

from sim.report import render_markdown, summarize
from tests.replay.test_report import BOUNDS, STATS, _result


def test_max_mean_columns_carry_their_ratio() -> None:
    s = summarize("ca", _result(), STATS, BOUNDS)  # requests 6/5, prefill busy 3.0/2.0 s
    md = render_markdown([s])
    assert "| 6/5 (1.20) | 3.0/2.0 (1.50) |" in md


def test_zero_mean_prints_no_ratio() -> None:
    s = replace(summarize("ca", _result(), STATS, BOUNDS), requests_max=0, requests_mean=0,
                prefill_busy_max_s=0.0, prefill_busy_mean_s=0.0)
    assert "| 0/0 (-) | 0.0/0.0 (-) |" in render_markdown([s])
