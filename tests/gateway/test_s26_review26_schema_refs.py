"""Session 26 review (review26) of gateway/schema_refs.py, the inlined-size count of ``limits.json_schema.max_bytes``.

S26-review26-1: only ``#/$defs/<name>`` and ``#/definitions/<name>`` were counted as local references. outlines-core's
``parse_ref`` (the compiler that inlines) resolves any object path after ``#``, a reference without ``#``, empty
parts (``#//$defs/a``, ``#$defs/a``) and a base equal to the root's ``$id``: a 20-level doubling chain written with
any of those forms (~1.3 KB) passed every bound and inlines to 2**20 copies.

S26-review26-2: a definition's count was memoized while a reference cycle was half counted (the node on the path
counted 0), so a cycle entered first at A and then 300 times at B counted B without A: the bound passed or not
depending on the order of the client's references.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config_http import JsonSchemaLimits
from gateway.response_format import response_format_refusal, tools_refusal
from gateway.schema_refs import inlined_bytes

LIMITS = JsonSchemaLimits()


def _size(value: Any) -> int:
    return len(orjson.dumps(value))


def _rf(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _doubling_defs(n: int, form: str) -> dict[str, Any]:
    defs: dict[str, Any] = {f"d{i}": {"anyOf": [{"$ref": form.format(i=i + 1)}, {"$ref": form.format(i=i + 1)}]}
                            for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": form.format(i=0)}


def _doubling_properties(n: int) -> dict[str, Any]:
    props: dict[str, Any] = {f"p{i}": {"anyOf": [{"$ref": f"#/properties/p{i + 1}"}, {"$ref": f"#/properties/p{i + 1}"}]}
                             for i in range(n)}
    props[f"p{n}"] = {"type": "string"}
    return {"type": "object", "properties": props}


def _with_id(schema: dict[str, Any]) -> dict[str, Any]:
    return {"$id": "urn:x", **schema}


@pytest.mark.parametrize("schema", [
    _doubling_properties(20),  # a pointer into the sent schema, not a definition
    _doubling_defs(20, "$defs/d{i}"),  # no '#': outlines-core reads the whole text as the path
    _doubling_defs(20, "#$defs/d{i}"),  # no '/' after '#'
    _doubling_defs(20, "#//$defs/d{i}"),  # empty parts dropped
    _doubling_defs(20, "#/%24defs/d{i}"),  # percent-escaped (RFC 6901 section 6)
    _with_id(_doubling_defs(20, "urn:x#/$defs/d{i}")),  # the root's own $id as base
], ids=["properties", "no-hash", "hash-no-slash", "empty-parts", "percent", "own-id"])
def test_every_local_reference_form_outlines_resolves_is_counted(schema: dict[str, Any]) -> None:
    assert _size(schema) < 2048
    err = response_format_refusal(_rf(schema), LIMITS, {}, 0)
    assert err is not None and err.code == "json_schema_too_complex" and "$ref are inlined" in err.message
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    err = tools_refusal(tools, LIMITS, {}, 0)
    assert err is not None and err.param == "tools.0.function.parameters"


def _cycle(order_b_first: bool) -> dict[str, Any]:
    big = {"type": "string", "description": "x" * 10_000}
    defs = {"A": {"anyOf": [{"$ref": "#/$defs/B"}, big]}, "B": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}}
    refs = [{"$ref": "#/$defs/A"}] + [{"$ref": "#/$defs/B"}] * 300
    return {"$defs": defs, "anyOf": refs[::-1] if order_b_first else refs}


@pytest.mark.parametrize("b_first", [False, True])
def test_a_cycle_counts_the_same_whichever_node_is_entered_first(b_first: bool) -> None:
    schema = _cycle(b_first)
    assert _size(schema) < LIMITS.max_bytes
    assert inlined_bytes(schema, _size, 1 << 30) == inlined_bytes(_cycle(not b_first), _size, 1 << 30)
    err = response_format_refusal(_rf(schema), LIMITS, {}, 0)
    assert err is not None and err.code == "json_schema_too_complex"


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"name": {"type": "string"}, "next": {"$ref": "#"}}},  # recursion by '#'
    {"$defs": {"Item": {"type": "object", "properties": {"id": {"type": "integer"}}}},
     "type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
                                      "first": {"$ref": "#/$defs/Item"}}},  # pydantic's form
    {"type": "object", "properties": {"a": {"type": "string"}, "b": {"$ref": "#/properties/a"}}},
    {"$defs": {"a": {"type": "string"}}, "$ref": "#/$defs/missing/x"},  # unresolvable tail: not counted beyond
])
def test_ordinary_references_still_pass(schema: dict[str, Any]) -> None:
    assert response_format_refusal(_rf(schema), LIMITS, {}, 0) is None


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if type(node) is dict:
        if type(ref := node.get("$ref")) is str and ref.startswith("#/$defs/"):
            return _inline(defs[ref[len("#/$defs/"):]], defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if type(node) is list:
        return [_inline(v, defs) for v in node]
    return node


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), max_size=3), min_size=1, max_size=6),
       st.lists(st.integers(0, 5), min_size=1, max_size=4))
def test_the_count_bounds_the_built_inlining_of_an_acyclic_schema(edges: list[list[int]], top: list[int]) -> None:
    # definition i refers only to definitions after it (acyclic): the built inlining is finite
    n = len(edges)
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{j}"} for j in out if i < j < n] + [{"type": "null"}]}
            for i, out in enumerate(edges)}
    schema = {"$defs": defs, "anyOf": [{"$ref": f"#/$defs/d{t % n}"} for t in top]}
    built = {k: v for k, v in _inline(schema, defs).items() if k != "$defs"}
    assert inlined_bytes(schema, _size, 1 << 40) >= _size(built)


# S26-review26-4: the tools' schemas were bounded once inlined each by max_bytes, never together: 128 tools of ~1 KB
# raw (128 KiB together, under max_tool_schemas_bytes) each inlining to just under 64 KiB: ~8 MB for the replica.

def _tool(i: int, levels: int) -> dict[str, Any]:
    schema = _doubling_defs(levels, "#/$defs/d{i}")
    schema["$defs"][f"d{levels}"] = {"type": "string", "description": "x" * 150}
    return {"type": "function", "function": {"name": f"f{i}", "parameters": schema}}


def test_the_tools_inlined_together_are_bounded_by_max_tool_schemas_bytes() -> None:
    one = _tool(0, 8)
    assert LIMITS.max_bytes // 2 < inlined_bytes(one["function"]["parameters"], _size, 1 << 30) <= LIMITS.max_bytes
    assert tools_refusal([one], LIMITS, {}, 0) is None  # one alone: within both bounds
    tools = [_tool(i, 8) for i in range(128)]
    assert _size(tools) < LIMITS.max_tool_schemas_bytes
    err = tools_refusal(tools, LIMITS, {}, 0)
    assert err is not None and err.code == "json_schema_too_complex" and err.param == "tools"
    assert "limits.json_schema.max_tool_schemas_bytes" in err.message and "$ref are inlined" in err.message
    assert err.record == {"reason": "tools parameters over limits.json_schema.max_tool_schemas_bytes"}
    assert tools_refusal(tools, LIMITS, {"max_tool_schemas_bytes": 1 << 30}, 0) is None  # the tenant's own bound


def test_tools_without_references_are_not_refused_by_the_inlined_sum() -> None:
    plain = [{"type": "function", "function": {"name": f"f{i}", "parameters": {
        "type": "object", "properties": {"a": {"type": "string", "description": "y" * 1500}}}}} for i in range(100)]
    assert _size(plain) < LIMITS.max_tool_schemas_bytes
    assert tools_refusal(plain, LIMITS, {}, LIMITS.max_tool_schemas_bytes) is None


def _inline_pointer(node: Any, root: dict[str, Any]) -> Any:
    if type(node) is dict:
        if type(ref := node.get("$ref")) is str and ref.startswith("#/properties/"):
            return _inline_pointer(root["properties"][ref[len("#/properties/"):]], root)
        return {k: _inline_pointer(v, root) for k, v in node.items()}
    if type(node) is list:
        return [_inline_pointer(v, root) for v in node]
    return node


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), max_size=3), min_size=1, max_size=6))
def test_the_count_bounds_the_built_inlining_of_pointers_into_the_sent_schema(edges: list[list[int]]) -> None:
    # property i refers only to properties after it (acyclic); the targets are inside the schema that is sent
    n = len(edges)
    props = {f"p{i}": {"anyOf": [{"$ref": f"#/properties/p{j}"} for j in out if i < j < n] + [{"type": "null"}]}
             for i, out in enumerate(edges)}
    schema = {"type": "object", "properties": props}
    built = _inline_pointer(schema, schema)
    count = inlined_bytes(schema, _size, 1 << 40)
    assert count >= _size(built) or (count == 0 and built == schema)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 5), max_size=3), min_size=1, max_size=6),
       st.lists(st.integers(0, 5), min_size=1, max_size=5), st.randoms(use_true_random=False))
def test_the_count_of_any_reference_graph_does_not_depend_on_the_order_of_references(
        edges: list[list[int]], top: list[int], rnd: Any) -> None:
    # cycles allowed (S26-review26-2): the same references in another order count the same
    n = len(edges)

    def schema(order: list[int]) -> dict[str, Any]:
        defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{j % n}"} for j in out] + [{"type": "null", "title": "t" * i}]}
                for i, out in enumerate(edges)}
        return {"$defs": defs, "anyOf": [{"$ref": f"#/$defs/d{t % n}"} for t in order]}

    shuffled = list(top)
    rnd.shuffle(shuffled)
    assert inlined_bytes(schema(top), _size, 1 << 40) == inlined_bytes(schema(shuffled), _size, 1 << 40)


@pytest.mark.parametrize("part", ["²", "①", "١", "٣"])
def test_a_non_ascii_digit_index_resolves_nothing_and_raises_nothing(part: str) -> None:
    """Lead, session 26 final read: ``str.isdigit`` holds for '²' and '①' but ``int`` refuses them (a
    ValueError escaped the bound as an exception); an RFC 6901 array index is ASCII digits only."""
    schema = {"type": "object", "properties": {"a": {"$ref": f"#/allOf/{part}"}}, "allOf": [{}, {"type": "string"}]}
    assert inlined_bytes(schema, _size, 65536) <= 2 * _size(schema)  # an upper bound, no exception
    assert response_format_refusal(_rf(schema), LIMITS, {}, 0) is None  # a small schema passes, no exception
    doubling = _doubling_properties(20)
    doubling["allOf"] = [{"$ref": f"#/allOf/{part}"}]
    refusal = response_format_refusal(_rf(doubling), LIMITS, {}, 0)  # the rest of the schema is still counted
    assert refusal is not None and "inlined" in str(refusal)
