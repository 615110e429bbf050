"""Issue 11 item 1 ("Done when"): no import cycle between modules or packages,
and every gateway module imports on its own.

The graph is read from the source (``ast``), every ``import``/``from … import``
at any depth (a function-level import is still a dependency), except those
under ``if TYPE_CHECKING:``.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "routing", "tenancy", "policy", "audit", "sim")


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for b in node.body for n in ast.walk(b))
    return skip


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            targets = [mod] + [f"{mod}.{a.name}" for a in node.names]
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node, each sorted (networkx, a dependency since
    session 27, S27-tidy27-1: was an own recursive Tarjan)."""
    return [sorted(c) for c in nx.strongly_connected_components(nx.DiGraph(graph)) if len(c) > 1]


def _strip_parents(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Drop edges from a module to its own parent packages (``a.b.c`` importing ``a.b``'s
    ``__init__`` is how Python loads it, not a design dependency)."""
    return {m: {t for t in deps if not m.startswith(t + ".")} for m, deps in graph.items()}


def test_no_import_cycle_between_modules() -> None:
    graph = _strip_parents(_graph())
    assert _cycles(graph) == []


def test_no_import_cycle_between_packages() -> None:
    pkg_graph: dict[str, set[str]] = {p: set() for p in PACKAGES}
    for mod, deps in _graph().items():
        src = mod.split(".")[0]
        pkg_graph[src] |= {d.split(".")[0] for d in deps if d.split(".")[0] != src}
    assert _cycles(pkg_graph) == [], pkg_graph


def test_the_cycle_check_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


GATEWAY_MODULES = sorted(m for m in _modules() if m == "gateway" or m.startswith("gateway."))


@pytest.mark.parametrize("module", GATEWAY_MODULES)
def test_each_gateway_module_imports_alone(module: str) -> None:
    res = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT, capture_output=True, text=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
