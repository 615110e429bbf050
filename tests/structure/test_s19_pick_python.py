"""Issue 14, session 19: the interpreter ``make setup`` builds ``.venv`` from (tools/pick_python.py)."""
from __future__ import annotations

import os
import pathlib
import stat
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import pick_python  # noqa: E402


def _fake(tmp_path: pathlib.Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_operator_choice_comes_first_then_distribution_then_path(tmp_path: pathlib.Path) -> None:
    own = _fake(tmp_path, "own", "exit 0")
    on_path = _fake(tmp_path, "python3", "exit 0")
    got = pick_python.candidates({"PREFIXGATE_PYTHON": own}, which=lambda _: on_path)
    expected = [own] + ([pick_python.DISTRIBUTION_PYTHON] if os.path.exists(pick_python.DISTRIBUTION_PYTHON) else [])
    assert got == expected + [on_path]


def test_missing_and_repeated_candidates_are_left_out(tmp_path: pathlib.Path) -> None:
    got = pick_python.candidates({"PREFIXGATE_PYTHON": str(tmp_path / "nope")}, which=lambda _: None)
    assert str(tmp_path / "nope") not in got
    same = pick_python.candidates({"PREFIXGATE_PYTHON": pick_python.DISTRIBUTION_PYTHON},
                                  which=lambda _: pick_python.DISTRIBUTION_PYTHON)
    assert len(same) == len(set(same))


def test_pick_takes_the_first_that_qualifies() -> None:
    assert pick_python.pick(["a", "b", "c"], ok=lambda p: p != "a") == "b"
    assert pick_python.pick(["a"], ok=lambda p: False) is None


def test_qualifies_runs_the_candidate(tmp_path: pathlib.Path) -> None:
    assert pick_python.qualifies(sys.executable)  # the test's own CPython >= 3.11 with venv
    assert not pick_python.qualifies(str(tmp_path / "missing"))
    assert not pick_python.qualifies(_fake(tmp_path, "old", "echo False"))  # too old / no ensurepip
    assert not pick_python.qualifies(_fake(tmp_path, "broken", "exit 3"))


def test_script_prints_the_operator_choice(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "PREFIXGATE_PYTHON": sys.executable}
    done = subprocess.run([sys.executable, str(REPO / "tools" / "pick_python.py")], env=env,
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == sys.executable


def test_a_refused_operator_choice_is_an_error_not_a_silent_fallback(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "PREFIXGATE_PYTHON": str(tmp_path / "missing")}
    done = subprocess.run([sys.executable, str(REPO / "tools" / "pick_python.py")], env=env,
                          capture_output=True, text=True, check=False)
    assert done.returncode == 1 and done.stdout == "" and "PREFIXGATE_PYTHON" in done.stderr
