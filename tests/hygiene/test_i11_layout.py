"""Issue 11 item 6: the shipped packages hold the product, not test servers or benches."""
from __future__ import annotations

import pathlib
import tomllib

from setuptools import find_packages

REPO = pathlib.Path(__file__).resolve().parents[2]


def _shipped() -> list[str]:
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())
    include = cfg["tool"]["setuptools"]["packages"]["find"]["include"]
    return find_packages(where=str(REPO), include=include)


def test_bench_and_tests_are_not_shipped() -> None:
    pkgs = _shipped()
    assert pkgs and not any(p.split(".")[0] in ("bench", "tests") for p in pkgs)


def test_no_test_server_or_bench_module_in_shipped_packages() -> None:
    for pkg in _shipped():
        if pkg.split(".")[0] == "sim":  # the simulator and its benchmark are a product of their own
            continue
        d = REPO / pkg.replace(".", "/")
        for name in ("bench.py", "opa_server.py"):
            assert not (d / name).exists(), f"{pkg}/{name}"
