"""Session 27 review (review27) of gateway/schema_refs.py.

S27-review27-1: a reference cycle was counted about once (its nodes once each, each reference inside it once more as
its target's bytes), but outlines-core, the compiler that inlines, unrolls it: ``parse_ref`` expands 4 nested
references and drops the 5th. A 140-byte root with 6 optional properties each ``{"$ref": "#"}`` counted 980 bytes and
outlines-core 0.2.14's ``build_regex_from_schema`` built a 6,933,223-character regular expression from it (k = 12: 3,250
bytes counted; k**4 copies built). Now a cycle counts as unrolled to :data:`gateway.schema_refs.REF_LEVELS`.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config_http import JsonSchemaLimits
from gateway.response_format import response_format_refusal, tools_refusal
from gateway.schema_refs import REF_LEVELS, inlined_bytes

LIMITS = JsonSchemaLimits()


def _size(value: Any) -> int:
    return len(orjson.dumps(value))


def _rf(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _self_root(k: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"p{i}": {"$ref": "#"} for i in range(k)}}


def _self_def(k: int) -> dict[str, Any]:
    node = {"type": "object", "properties": {f"p{i}": {"$ref": "#/$defs/N"} for i in range(k)}}
    return {"$defs": {"N": node}, "$ref": "#/$defs/N"}


def _self_pointer(k: int) -> dict[str, Any]:  # the cycle through a pointer into the sent schema
    return {"type": "object", "properties": {"n": {"type": "object", "properties": {
        f"p{i}": {"$ref": "#/properties/n"} for i in range(k)}}}}


def _mutual(k: int) -> dict[str, Any]:  # A -> B -> A, k references each way
    a = {"anyOf": [{"$ref": "#/definitions/B"} for _ in range(k)] + [{"type": "null"}]}
    b = {"type": "array", "prefixItems": [{"$ref": "#/definitions/A"} for _ in range(k)]}
    return {"definitions": {"A": a, "B": b}, "$ref": "#/definitions/A"}


@pytest.mark.parametrize("schema", [_self_root(6), _self_root(12), _self_def(8), _self_pointer(8), _mutual(10)],
                         ids=["root-6", "root-12", "def-8", "pointer-8", "mutual-10"])
def test_a_cycle_with_fan_out_is_counted_as_the_compiler_unrolls_it(schema: dict[str, Any]) -> None:
    assert _size(schema) < 1024  # before: counted ~k times its bytes and forwarded
    assert inlined_bytes(schema, _size, LIMITS.max_bytes) > LIMITS.max_bytes
    err = response_format_refusal(_rf(schema), LIMITS, {}, 0)
    assert err is not None and err.code == "json_schema_too_complex" and "$ref are inlined" in err.message
    assert err.record == {"reason": "response_format over limits.json_schema.max_bytes"}
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    err = tools_refusal(tools, LIMITS, {}, 0)
    assert err is not None and err.param == "tools.0.function.parameters"


def test_the_root_cycle_counts_its_unrolled_copies() -> None:
    # 1 + k + k**2 + k**3 + k**4 copies of the root (each holding its reference texts)
    for k in (1, 2, 3):
        schema = _self_root(k)
        assert inlined_bytes(schema, _size, 1 << 40) == _size(schema) * sum(k ** d for d in range(REF_LEVELS + 1))


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"value": {"type": "integer"}, "next": {"$ref": "#"}}},  # a linked list
    {"$defs": {"Node": {"type": "object", "properties": {"name": {"type": "string"}, "children": {
        "type": "array", "items": {"$ref": "#/$defs/Node"}}}}}, "$ref": "#/$defs/Node"},  # a tree
    {"$defs": {"J": {"anyOf": [{"type": ["string", "number", "boolean", "null"]},
                               {"type": "array", "items": {"$ref": "#/$defs/J"}},
                               {"type": "object", "additionalProperties": {"$ref": "#/$defs/J"}}]}},
     "$ref": "#/$defs/J"},  # any JSON value
])
def test_ordinary_recursive_schemas_still_pass(schema: dict[str, Any]) -> None:
    assert response_format_refusal(_rf(schema), LIMITS, {}, 0) is None


def _unroll(node: Any, defs: dict[str, Any], level: int) -> Any:
    """What an inlining compiler builds: each ``#/$defs/`` reference by its target, REF_LEVELS deep; a reference
    below that kept as written (outlines-core drops it)."""
    if type(node) is dict:
        if type(ref := node.get("$ref")) is str and ref.startswith("#/$defs/") and level < REF_LEVELS:
            return _unroll(defs[ref[len("#/$defs/"):]], defs, level + 1)
        return {k: _unroll(v, defs, level) for k, v in node.items()}
    if type(node) is list:
        return [_unroll(v, defs, level) for v in node]
    return node


@settings(max_examples=80, deadline=None)
@given(st.lists(st.lists(st.integers(0, 4), max_size=3), min_size=1, max_size=5),
       st.lists(st.integers(0, 4), min_size=1, max_size=3))
def test_the_count_bounds_the_unrolled_inlining_of_any_reference_graph(edges: list[list[int]], top: list[int]) -> None:
    # cycles allowed: the count is at least what the compiler builds, unrolled REF_LEVELS deep
    n = len(edges)
    defs = {f"d{i}": {"anyOf": [{"$ref": f"#/$defs/d{j % n}"} for j in out] + [{"type": "null"}]}
            for i, out in enumerate(edges)}
    schema = {"$defs": defs, "anyOf": [{"$ref": f"#/$defs/d{t % n}"} for t in top]}
    built = {k: v for k, v in _unroll(schema, defs, 0).items() if k != "$defs"}
    assert inlined_bytes(schema, _size, 1 << 40) >= _size(built)
