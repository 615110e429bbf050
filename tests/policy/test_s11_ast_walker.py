"""Session 11 (review D7): one walker of OPA's JSON AST serves both readers of a module,
:mod:`policy.rego_calls` (the calls, for the built-in allow-list) and :mod:`policy.input_refs`
(the input paths, for the decision cache's key)."""
from __future__ import annotations

from typing import Any

from policy import input_refs, rego_calls
from policy.rego_calls import AstWalker, ModuleMemo, package_path, parse_module

SOURCE = """package team.routing

# a comment the walk skips
allow if {
    input.request.model == "m"
    count(input.candidates) > 0
}
"""


class _Types(AstWalker):
    def __init__(self) -> None:
        self.types: list[str] = []
        self.keys: set[str] = set()

    def visit(self, node: dict[str, Any]) -> bool:
        self.keys |= set(node)
        if isinstance(node.get("type"), str):
            self.types.append(node["type"])
        return False


def test_the_walk_reaches_every_term_and_skips_locations_comments_and_annotations() -> None:
    ast = parse_module("p.rego", SOURCE)
    walker = _Types()
    walker.walk(ast)
    assert {"ref", "var", "string", "call", "number"} <= set(walker.types)
    # the module has comments and every node a location, but the walk never enters them
    assert ast.get("comments")
    assert not {"row", "col", "text", "file"} & walker.keys


def test_a_visit_that_answers_true_stops_the_descent() -> None:
    class Refs(AstWalker):
        def __init__(self) -> None:
            self.refs = 0
            self.vars: set[str] = set()

        def visit(self, node: dict[str, Any]) -> bool:
            if node.get("type") == "ref":
                self.refs += 1
                return True
            if node.get("type") == "var":
                self.vars.add(node["value"])
            return False

    w = Refs()
    w.walk(parse_module("p.rego", SOURCE))
    assert w.refs >= 3  # input.request.model, count, input.candidates
    assert "input" not in w.vars and "count" not in w.vars  # the heads of those refs: not reached


def test_package_path() -> None:
    assert package_path(parse_module("p.rego", SOURCE)) == ("team", "routing")
    assert package_path({}) == ()


def test_module_memo_computes_once_per_id_and_source_and_stays_bounded() -> None:
    memo: ModuleMemo[int] = ModuleMemo(max_entries=2)
    calls: list[str] = []

    def compute(src: str) -> int:
        calls.append(src)
        return len(src)

    assert memo.get("a", "xx", lambda: compute("xx")) == 2
    assert memo.get("a", "xx", lambda: compute("xx")) == 2
    assert calls == ["xx"]
    memo.get("b", "y", lambda: compute("y"))
    memo.get("c", "zzz", lambda: compute("zzz"))  # full: cleared, then kept
    assert len(memo) <= 2


def test_both_readers_walk_with_the_shared_walker() -> None:
    assert issubclass(rego_calls._Walker, AstWalker)
    assert issubclass(input_refs._Scan, AstWalker)
