"""bench/cython_modules.txt (session 23, issue 14 sizing): every module bench.cython_build compiles is an
existing source file of a shipped package, listed once, and the build refuses a git working tree."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.cython_build import MODULES, main, module_list

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("gateway", "routing", "tenancy", "policy", "audit")


def test_every_listed_module_is_an_existing_shipped_source_file() -> None:
    names = module_list(MODULES)
    assert names, "the list is empty"
    assert len(names) == len(set(names)), "a module is listed twice"
    missing = [n for n in names if not (ROOT / n).is_file()]
    assert not missing, f"listed but not in the tree: {missing}"
    assert all(n.endswith(".py") and n.split("/")[0] in SHIPPED for n in names)
    assert not any(n.endswith("__init__.py") for n in names)


def test_module_list_skips_comments_and_blank_lines(tmp_path: Path) -> None:
    listing = tmp_path / "m.txt"
    listing.write_text("# header\n\ngateway/flow.py  # hot\n# routing/index.py (left pure)\n", encoding="utf-8")
    assert module_list(listing) == ["gateway/flow.py"]


@pytest.mark.parametrize("marker", ["dir", "file"])
def test_build_refuses_a_git_working_tree(tmp_path: Path, marker: str) -> None:
    """A worktree has a ``.git`` file, a clone a ``.git`` directory: neither is a scratch export."""
    if marker == "dir":
        (tmp_path / ".git").mkdir()
    else:
        (tmp_path / ".git").write_text("gitdir: /elsewhere\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["--into", str(tmp_path)])
    assert result.exit_code == 2 and "scratch export" in result.output
