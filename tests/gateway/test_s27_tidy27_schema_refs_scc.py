"""Session 27 (tidy27, S27-tidy27-1): gateway/schema_refs.py ``_count`` takes the strongly connected components of
the owners' graph and their order from networkx (``condensation``, ``topological_sort``) instead of its own Tarjan.

Differential: the own Tarjan of session 26 (kept below, verbatim but for its name and comments, as the oracle) and
the networkx count give the same inlined bytes for the same graph, encode the same nodes, and the gateway refuses
the same schemas with either."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import schema_refs
from gateway.config_http import JsonSchemaLimits
from gateway.response_format import response_format_refusal
from gateway.schema_refs import _settle, inlined_bytes

LIMITS = JsonSchemaLimits()


def _tarjan_count(root: int, nodes: dict[int, Any], refs: dict[int, list[int]], kids: dict[int, list[int]],
                  size_of: Callable[[Any], int], cap: int) -> int:
    """gateway/schema_refs.py ``_count`` at 7796def (Tarjan's algorithm without recursion)."""
    inl: dict[int, int] = {}
    ext: dict[int, int] = {}
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    comp: list[int] = []
    out: dict[int, list[int]] = {}
    work: list[tuple[int, int]] = [(root, 0)]
    while work:
        v, i = work.pop()
        if i == 0:
            index[v] = low[v] = len(index)
            comp.append(v)
            on_stack.add(v)
            out[v] = refs.get(v, []) + kids.get(v, [])
        edges = out[v]
        if i < len(edges):
            work.append((v, i + 1))
            w = edges[i]
            if w not in index:
                work.append((w, 0))
            elif w in on_stack:
                low[v] = min(low[v], index[w])
            continue
        for w in edges:
            if w in on_stack and w not in inl:
                low[v] = min(low[v], low[w])
        if low[v] != index[v]:
            continue
        members = []
        while True:
            w = comp.pop()
            on_stack.discard(w)
            members.append(w)
            if w == v:
                break
        _settle(members, nodes, refs, kids, inl, ext, size_of, cap)
    return inl[root]


def _size(value: Any) -> int:
    return len(orjson.dumps(value))


def _graphs() -> st.SearchStrategy[tuple[dict[int, list[int]], dict[int, list[int]], list[int], int]]:
    """(refs, kids, sizes, cap) over nodes 0..n-1 (root 0): duplicate references, self-loops, cycles, nodes the
    root does not reach."""
    return st.integers(1, 10).flatmap(lambda n: st.tuples(
        st.dictionaries(st.integers(0, n - 1), st.lists(st.integers(0, n - 1), max_size=4), max_size=n),
        st.dictionaries(st.integers(0, n - 1), st.lists(st.integers(0, n - 1), max_size=2), max_size=n),
        st.lists(st.integers(1, 10_000), min_size=n, max_size=n),
        st.sampled_from([50, 1000, 30_000, 1 << 40])))


@settings(max_examples=400, deadline=None)
@given(_graphs())
def test_networkx_components_count_as_the_own_tarjan_did(graph: tuple[Any, ...]) -> None:
    refs, kids, sizes, cap = graph
    nodes = {i: i for i in range(len(sizes))}
    asked: list[set[int]] = [set(), set()]

    def sizer(k: int) -> Callable[[int], int]:
        def size_of(node: int) -> int:
            asked[k].add(node)
            return sizes[node]
        return size_of
    want = _tarjan_count(0, nodes, refs, kids, sizer(0), cap)
    assert schema_refs._count(0, nodes, refs, kids, sizer(1), cap) == want
    assert asked[1] == asked[0]  # the nodes the root reaches are encoded, no others


def _schemas() -> st.SearchStrategy[dict[str, Any]]:
    """A ``$defs`` graph with cycles, plus references into the sent schema (``#/properties/..``)."""
    def build(edges: list[list[int]], top: list[int], pads: list[int], props: list[list[int]]) -> dict[str, Any]:
        n = len(edges)
        defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{j % n}"} for j in out]
                          + [{"type": "string", "description": "x" * pads[i % len(pads)]}]}
                for i, out in enumerate(edges)}
        schema: dict[str, Any] = {"$defs": defs, "anyOf": [{"$ref": f"#/$defs/d{t % n}"} for t in top]}
        if props:
            m = len(props)
            schema["properties"] = {f"p{i}": {"anyOf": [{"$ref": f"#/properties/p{j % m}"} for j in out]
                                              + [{"$ref": f"#/$defs/d{i % n}"}]} for i, out in enumerate(props)}
        return schema
    return st.builds(build, st.lists(st.lists(st.integers(0, 7), max_size=3), min_size=1, max_size=8),
                     st.lists(st.integers(0, 7), min_size=1, max_size=6),
                     st.lists(st.integers(0, 9000), min_size=1, max_size=4),
                     st.lists(st.lists(st.integers(0, 3), max_size=2), max_size=4))


@settings(max_examples=200, deadline=None)
@given(_schemas(), st.sampled_from([200, 5000, 65_536, 1 << 40]))
def test_the_same_schemas_count_and_are_refused_as_with_the_own_tarjan(schema: dict[str, Any], cap: int) -> None:
    got = inlined_bytes(schema, _size, cap)
    refusal = response_format_refusal({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
                                      LIMITS, {}, 0)
    with mock.patch.object(schema_refs, "_count", _tarjan_count):
        assert inlined_bytes(schema, _size, cap) == got
        before = response_format_refusal({"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
                                         LIMITS, {}, 0)
    assert (refusal and (refusal.code, refusal.param, refusal.message)) == (
        before and (before.code, before.param, before.message))


def test_a_ring_of_20000_definitions_counts_without_recursion_as_before() -> None:
    n = 20_000
    schema = {"$defs": {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{(i + 1) % n}"}]} for i in range(n)},
              "$ref": "#/$defs/d0"}
    got = inlined_bytes(schema, _size, 1 << 40)
    with mock.patch.object(schema_refs, "_count", _tarjan_count):
        assert inlined_bytes(schema, _size, 1 << 40) == got > _size(schema)
