"""Issue 11 item 4: one CLI library. Every entry point in the shipped packages and in
bench/ parses its options with click (product CLIs directly, ``python -m sim.*`` and
``python -m bench.*`` scripts and tests/support/opa_server.py through
:class:`sim.click_options.ClickOptions`); none
imports argparse."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "routing", "tenancy", "policy", "audit", "sim", "bench", "tests/support")


def _argparse_imports(path: Path) -> list[int]:
    """Line numbers of ``import argparse`` / ``from argparse import ...`` in ``path``."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "argparse" for a in node.names):
            lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "argparse":
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_argparse(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"no modules under {package}/"
    offenders = [f"{p.relative_to(ROOT)}:{n}" for p in files for n in _argparse_imports(p)]
    assert not offenders, f"argparse imported (use click): {offenders}"


def test_click_options_parse_like_the_scripts_expect() -> None:
    """Flags, repeatable options, hidden options and usage errors behave as the scripts rely on."""
    from sim.click_options import ClickOptions

    ap = ClickOptions(prog="x")
    ap.option("--runs", type=int, default=3)
    ap.option("--baseline-set", multiple=True, default=[], metavar="KEY=VALUE")
    ap.option("--keep-workdir", is_flag=True)
    ap.option("--port", type=int, hidden=True)
    args = ap.parse(["--baseline-set", "a=1", "--baseline-set", "b=2", "--keep-workdir", "--port", "9"])
    assert (args.runs, args.baseline_set, args.keep_workdir, args.port) == (3, ["a=1", "b=2"], True, 9)
    assert ap.parse([]).baseline_set == [] and ap.parse([]).port is None
    with pytest.raises(SystemExit) as exc:
        ap.parse(["--nope"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        ap.parse(["-h"])
    assert exc.value.code == 0
