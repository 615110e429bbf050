from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.bounds import HitRateBounds
from sim.replay import ReplayResult, RequestRecord
from sim.report import median_summary, percentile, render_markdown, summarize, write_report


def _result() -> ReplayResult:
    recs = [RequestRecord(i, "tenant-a", float(i), 10, ttft_s=float(i + 1), e2e_s=float(2 * (i + 1)),
                          prompt_tokens=10, cached_tokens=5) for i in range(10)]
    recs.append(RequestRecord(10, "tenant-a", 10.0, 10, error="http_429"))
    return ReplayResult(recs, 10.0, 1.0, "http://x", 0)


BOUNDS = HitRateBounds(oracle=0.5, pooled=0.4, rows=11, replicas=2, capacity_blocks=10, block_size=16,
                       tenants=1, prompt_tokens=110)
STATS = [
    {"prompt_tokens": 60, "cached_tokens": 30, "requests": 6, "prefill_busy_s": 3.0},
    {"prompt_tokens": 40, "cached_tokens": 0, "requests": 4, "prefill_busy_s": 1.0},
]


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0], 99) == 3.0
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile(list(range(101)), 90) == pytest.approx(90)


def test_summarize_reads_hit_rate_from_replicas() -> None:
    s = summarize("rr", _result(), STATS, BOUNDS)
    assert (s.requests, s.ok) == (11, 10)
    assert s.hit_rate == pytest.approx(0.3)  # 30 / 100 from the replicas, not the client's 0.5
    assert s.hit_vs_pooled == pytest.approx(0.75) and s.hit_vs_oracle == pytest.approx(0.6)
    assert s.ttft_p50 == pytest.approx(5.5) and s.e2e_p99 == pytest.approx(19.82)
    assert (s.requests_max, s.requests_mean) == (6, 5)
    assert (s.prefill_busy_max_s, s.prefill_busy_mean_s) == (3.0, 2.0)
    assert s.errors == {"http_429": 1}
    # falls back to the client-side usage figures without replica counters
    assert summarize("rr", _result(), [], None).hit_rate == pytest.approx(0.5)


def test_median_and_rendering(tmp_path: Path) -> None:
    a = summarize("ca", _result(), STATS, BOUNDS)
    b = summarize("ca", _result(), [{**STATS[0], "cached_tokens": 50}, STATS[1]], BOUNDS)
    c = summarize("ca", _result(), [{**STATS[0], "cached_tokens": 60}, STATS[1]], BOUNDS)
    m = median_summary([a, b, c])
    assert m.hit_rate == pytest.approx(0.5) and m.runs == 3 and m.errors == {"http_429": 3}
    with pytest.raises(ValueError):
        median_summary([a, summarize("rr", _result(), STATS, BOUNDS)])
    md = render_markdown([a, m], "cmp")
    assert "| ca | 10/11 |" in md and "0.300" in md and "http_429: 3" in md
    jp, mp = write_report([a], tmp_path, "demo", meta={"rows": 11})
    assert json.loads(jp.read_text())["routers"][0]["router"] == "ca"
    assert "rows=11" in mp.read_text()
