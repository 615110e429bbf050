"""bench/_tree_rounds.py (session 29, S27-tidy27-5): the per-tree benches' shared round runner and report rows.
The orders the benches used (rotating, alternating, fixed), the child's JSON, the summaries; one bench
(bench.cut28_micro) end to end with tiny counts on this tree twice."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench import _tree_rounds as tr
from bench import cut28_micro

ROOT = Path(__file__).resolve().parents[2]


def _order_seen(order: tr.Order, rounds: int = 4) -> list[list[str]]:
    seen: list[str] = []
    rows, loads = tr.interleaved({"a": "A", "b": "B", "c": "C"}, rounds, lambda t: seen.append(str(t)) or len(seen),
                                 order=order)
    assert len(loads) == rounds and all(len(v) == rounds for v in rows.values())
    return [seen[i:i + 3] for i in range(0, len(seen), 3)]


def test_orders() -> None:
    assert _order_seen("rotate") == [["A", "B", "C"], ["B", "C", "A"], ["C", "A", "B"], ["A", "B", "C"]]
    assert _order_seen("alternate") == [["A", "B", "C"], ["C", "B", "A"], ["A", "B", "C"], ["C", "B", "A"]]
    assert _order_seen("fixed", 2) == [["A", "B", "C"], ["A", "B", "C"]]


def test_results_per_tree_and_progress_lines(capsys: pytest.CaptureFixture[str]) -> None:
    rows, _ = tr.interleaved([("x", "1"), ("y", "2")], 2, lambda t: {"v": float(t)}, describe=lambda r: f"{r['v']:.1f}",
                             load=True)
    assert rows == {"x": [{"v": 1.0}, {"v": 1.0}], "y": [{"v": 2.0}, {"v": 2.0}]}
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("round 1/2 (load ") and out[0].endswith("): x 1.0; y 2.0")


def test_summaries_and_rows() -> None:
    rows = {"a": [{"k": 1.0}, {"k": 3.0}, {"k": 2.0}], "b": [{"k": 5.0}, {"k": 4.0}, {"k": 6.0}]}
    summary, spread = tr.median_range(rows, ["k"], 2)
    assert summary == {"a": {"k": 2.0}, "b": {"k": 5.0}} and spread == {"a": {"k": [1.0, 3.0]}, "b": {"k": [4.0, 6.0]}}
    assert tr.median_range_rows(summary, spread, ["k"]) == ["| tree | k |", "|---|---:|", "| a | 2.0 [1.0-3.0] |",
                                                           "| b | 5.0 [4.0-6.0] |"]
    med, diffs = tr.this_minus({"this": {"k": [1.0, 2.0, 3.0]}, "base": {"k": [2.0, 2.5, 4.0]}}, ["k"])
    assert med == {"this": {"k": 2.0}, "base": {"k": 2.5}} and diffs == {"base": {"k": -1.0}}
    lines = tr.this_minus_rows(med, diffs, ["k"])
    assert lines[2] == "| this | 2.000 |" and lines[-1] == "| base | -1.000 |"
    runs = {"this": [1.0, 2.0, 3.0], "aa": [1.5, 2.0, 2.0]}
    med1, diffs1 = tr.one_figure(runs)
    assert med1 == {"this": 2.0, "aa": 2.0} and diffs1 == {"aa": 0.0}
    assert tr.one_figure_rows({"this": "/t", "aa": "/a"}, runs, med1, diffs1) == [
        "| tree | path | median µs | runs |", "|---|---|---:|---|", "| this | `/t` | 2.00 | 1.00, 2.00, 3.00 |",
        "| aa | `/a` | 2.00 | 1.50, 2.00, 2.00 |", "", "Median per-round difference, this minus: aa +0.00 µs."]


def test_child_json_runs_in_the_tree_with_its_path(tmp_path: Path) -> None:
    got = tr.code_child("import json, os, sys\nprint('noise')\nprint(json.dumps([TREE, N, os.getcwd(), "
                        "os.environ['PYTHONPATH']]))", tmp_path, {"TREE": str(tmp_path), "N": 3})
    assert got == [str(tmp_path), 3, str(tmp_path), str(tmp_path)]
    with pytest.raises(subprocess.CalledProcessError):
        tr.child_json([sys.executable, "-c", "raise SystemExit(3)"], tmp_path)


def test_cut28_micro_end_to_end(tmp_path: Path) -> None:
    assert cut28_micro.main(["--this", str(ROOT), "--baseline", str(ROOT), "--rounds", "2", "--n", "3",
                             "--out", str(tmp_path), "--name", "t"]) == 0
    doc = json.loads((tmp_path / "t.json").read_text())
    assert set(doc["runs"]) == {"this", "baseline"} and all(len(v) == 2 for v in doc["runs"]["this"].values())
    md = (tmp_path / "t.md").read_text().splitlines()
    assert md[4] == "| tree | " + " | ".join(cut28_micro.FIGURES) + " |" and md[-1].startswith("| baseline | ")
