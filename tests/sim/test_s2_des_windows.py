"""``sim.des_windows``: the windowed DES summary (issue 15, branch s2-route2)."""

from __future__ import annotations

from sim.des_windows import run_setting


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_one_setting_summarises_every_rule_over_the_windows() -> None:
    """One row per rule (the SGLang imitation first, then each variant), the
    window count in the '> 1.2' column, max >= mean, and the imitation's own
    p50 ratio exactly 1."""
    lines = run_setting((("fifo", "x1", {}), 2, 120, {"default": {}, "uncal": {"calibrate": False}}))
    rows = [_cells(line) for line in lines]
    assert [r[2] for r in rows] == ["sglang_like", "default", "uncal"]
    for r in rows:
        assert r[0] == "fifo" and r[1] == "x1"
        assert r[5].endswith("/2")
        assert float(r[4]) >= float(r[3]) - 0.005  # max over windows >= mean (rounded)
        assert 0.0 < float(r[6]) <= 1.2 and float(r[7]) <= float(r[6]) + 0.0005
    assert rows[0][8] == "1.00"


def test_windows_are_distinct_trace_slices() -> None:
    """Two windows give a different mean than the first window alone (the
    second window is rows 121-240, not the first again)."""
    two = _cells(run_setting((("fifo", "x1", {}), 2, 120, {}))[0])
    one = _cells(run_setting((("fifo", "x1", {}), 1, 120, {}))[0])
    assert two[5].endswith("/2") and one[5].endswith("/1")
    assert (two[3], two[6]) != (one[3], one[6])  # equal only if window 2 replayed window 1
