"""bench.overhead's slot start path and paired slot comparison (session 28, S28-lead-1).

``--this-export`` starts the ``prefixgate`` slot from an export of HEAD (``export_tree``: tracked files
only, as a ``--baseline`` export is made) instead of the repository on disk; ``slot_check`` pairs the
slots run by run, because :func:`bench.overhead.summarize` takes each target's median on its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench import overhead


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    """A git work tree: ``gateway/mod.py`` committed, then edited without a commit, an untracked file,
    a ``__pycache__`` file and an ignored directory (what a repository on disk holds and an export not)."""
    root = tmp_path / "repo"
    (root / "gateway" / "__pycache__").mkdir(parents=True)
    (root / "gateway" / "mod.py").write_text("VALUE = 1\n")
    (root / ".gitignore").write_text("__pycache__/\n*.egg-info/\n")
    _git(root.parent, "init", "-q", str(root))
    _git(root, "add", "-A")
    _git(root, "-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "one")
    (root / "gateway" / "mod.py").write_text("VALUE = 2\n")  # uncommitted
    (root / "gateway" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0" * 16)
    (root / "scratch.py").write_text("untracked\n")
    (root / "prefixgate.egg-info").mkdir()
    (root / "prefixgate.egg-info" / "PKG-INFO").write_text("Name: prefixgate\n")
    return root


def _files(tree: Path) -> set[str]:
    return {p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.is_file()}


def test_export_tree_holds_heads_tracked_files_only(repo: Path, tmp_path: Path) -> None:
    dest = overhead.export_tree(repo, tmp_path / "export")
    assert _files(dest) == {".gitignore", "gateway/mod.py"}
    assert (dest / "gateway" / "mod.py").read_text() == "VALUE = 1\n"  # HEAD's content, not the edit


def test_export_tree_refuses_a_non_empty_destination_and_a_non_repository(repo: Path, tmp_path: Path) -> None:
    dest = tmp_path / "busy"
    dest.mkdir()
    (dest / "old.py").write_text("")
    with pytest.raises(RuntimeError, match="not empty"):
        overhead.export_tree(repo, dest)
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(RuntimeError, match="git archive"):
        overhead.export_tree(plain, tmp_path / "export2")


def test_slot_trees_start_prefixgate_from_the_repository_or_from_an_export(repo: Path, tmp_path: Path) -> None:
    base = tmp_path / "baseline"
    assert overhead.slot_trees(repo, None, None) == {"prefixgate": repo}
    assert overhead.slot_trees(repo, base, None) == {"prefixgate": repo, "baseline": base}
    trees = overhead.slot_trees(repo, base, tmp_path / "work" / "this-export")
    assert trees["baseline"] == base
    assert trees["prefixgate"] == tmp_path / "work" / "this-export" != repo
    assert _files(trees["prefixgate"]) == {".gitignore", "gateway/mod.py"}


def test_main_accepts_this_export(monkeypatch: pytest.MonkeyPatch) -> None:
    def stop(name: str) -> None:  # the first step after the options are read
        raise overhead.loadgen.WrkMissingError("options read")

    monkeypatch.setattr(overhead.loadgen, "require_generator", stop)
    with pytest.raises(SystemExit, match="options read"):  # an unknown option exits with a usage error instead
        overhead.main(["--this-export", "--targets", "prefixgate,baseline"])


def _row(pg_cpu: float, bl_cpu: float, pg_p50: float, bl_p50: float) -> dict[str, object]:
    order = ["prefixgate", "baseline"]

    def slot(cpu: float, p50: float) -> dict[str, object]:
        return {"peak": {"rps": 100.0, "errors": 0}, "sequential_cpu_us": cpu,
                "sequential": {"p50_ms": p50, "p90_ms": p50, "p99_ms": p50, "errors": 0}}

    return {"order": order, "start_order": order, "prefixgate": slot(pg_cpu, pg_p50), "baseline": slot(bl_cpu, bl_p50)}


def test_slot_check_pairs_runs_where_independent_medians_mislead() -> None:
    # session 28's shape: big run-to-run swings; the independent medians (800 vs 700) put the baseline
    # 100 µs below prefixgate although it used more CPU in two runs of three
    runs = [_row(500.0, 520.0, 0.80, 0.81), _row(800.0, 820.0, 1.00, 1.02), _row(900.0, 700.0, 1.20, 1.00)]
    s = overhead.summarize(runs, ["prefixgate", "baseline"])
    assert s["prefixgate"]["cpu_us_per_request"] == 800.0 and s["baseline"]["cpu_us_per_request"] == 700.0
    c = overhead.slot_check(runs)
    assert [x["cpu_diff_us"] for x in c["runs"]] == [20.0, 20.0, -200.0]
    assert [x["p50_diff_ms"] for x in c["runs"]] == [0.01, 0.02, -0.2]
    assert c["cpu_diff_us_median"] == 20.0 and c["cpu_b_higher_runs"] == 2
    assert c["p50_diff_ms_median"] == 0.01


def test_slot_check_without_cpu_figures_keeps_working() -> None:
    runs = [_row(1.0, 2.0, 1.0, 1.1)]
    for slot in ("prefixgate", "baseline"):
        del runs[0][slot]["sequential_cpu_us"]  # type: ignore[attr-defined]
    c = overhead.slot_check(runs)
    assert c["runs"][0]["cpu_diff_us"] is None and c["cpu_diff_us_median"] is None and c["cpu_b_higher_runs"] == 0


def test_markdown_prints_the_paired_line_and_the_slots_tree() -> None:
    runs = [_row(500.0, 520.0, 0.80, 0.81), _row(800.0, 820.0, 1.00, 1.02), _row(900.0, 700.0, 1.20, 1.00)]
    doc = {"args": {"runs": 3, "sequential": 10, "clients": 1, "seconds": 1.0, "stream": False},
           "cpus": 2, "python": "3.11", "wall_s": 1.0, "seed": 1, "summary": {},
           "slot_check": overhead.slot_check(runs), "this_tree": "/tmp/work/this-export",
           "audit_timings_ms": {"events": 0}, "profile": None}
    md = overhead.to_markdown(doc)
    assert "Paired per run, baseline minus prefixgate" in md
    assert "+20.0, +20.0, -200.0 µs/req (median 20.0; baseline higher in 2 of 3 runs)" in md
    assert "prefixgate slot started from /tmp/work/this-export" in md


def test_critical_path_pairs_rounds() -> None:
    from bench import critical_path

    # the difference of the medians (300 - 200 = +100) says this is slower; round by round it is faster in 2 of 3
    per = {"this": [{"total_cpu": 300.0}, {"total_cpu": 190.0}, {"total_cpu": 500.0}],
           "baseline": [{"total_cpu": 200.0}, {"total_cpu": 195.0}, {"total_cpu": 510.0}]}
    p = critical_path.paired_rounds(per, ["total_cpu"])
    assert p == {"rounds": 3, "median_us": {"total_cpu": -5.0}, "this_higher": {"total_cpu": 1}}
    assert critical_path.paired_rounds({"this": [], "baseline": []}, ["total_cpu"])["median_us"] == {"total_cpu": None}


def test_tree_start_aa_per_request_and_pairs_to_the_first_tree() -> None:
    import os

    from bench import tree_start_aa as t

    row = t.per_request({"main_ns": 1_000, "all_ns": 2_000, "minflt": 10, "vcsw": 4, "ivcsw": 1},
                        {"main_ns": 401_000, "all_ns": 602_000, "minflt": 30, "vcsw": 8, "ivcsw": 3}, 2)
    assert row == {"main_us": 200.0, "all_us": 300.0, "minflt": 10.0, "vcsw": 2.0, "ivcsw": 1.0}
    rows = {"repo": [{"main_us": 400.0}, {"main_us": 500.0}, {"main_us": 450.0}],
            "export": [{"main_us": 410.0}, {"main_us": 480.0}, {"main_us": 440.0}],
            "aa": [{"main_us": 400.0}, {"main_us": 520.0}, {"main_us": 470.0}]}
    p = t.paired_to_first(rows, ["main_us"])
    assert p == {"export": {"main_us": -10.0, "higher": 1}, "aa": {"main_us": 20.0, "higher": 2}}
    c = t.counters(os.getpid())  # this process: every counter present and non-negative
    assert set(c) == {"main_ns", "all_ns", "minflt", "vcsw", "ivcsw"} and min(c.values()) >= 0
    assert c["all_ns"] >= c["main_ns"] > 0


def test_tree_start_aa_refuses_a_tree_without_a_name() -> None:
    from bench import tree_start_aa as t

    with pytest.raises(SystemExit, match="expected NAME=DIR"):
        t.main(["--tree", "/work/main"])


def test_tree_start_aa_reads_how_a_process_was_started(tmp_path: Path) -> None:
    import sys

    from bench import tree_start_aa as t

    code = "import sys; print('up', flush=True); sys.stdin.read()"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            env={"PYTHONPATH": str(tmp_path), "GOGC": "400"})
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"up\n"  # running: its exec is over
        got = t.started_from(proc.pid)
    finally:
        proc.communicate(b"")
    assert got["cwd"] == str(tmp_path) and got["PYTHONPATH"] == str(tmp_path) and got["GOGC"] == "400"
    assert got["cmdline"].endswith("-c " + code)
