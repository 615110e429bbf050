"""Session 30 (review30, S30-review30-2): ``max_pattern_states`` counted an array's item copies for a ``pattern``
written in its ``items`` but not for one reached through a ``$ref`` there. outlines-core inlines the reference, so
``{"items": {"$ref": "#/$defs/p"}, "maxItems": 128}`` builds the very regular expression of the inlined schema (checked:
``build_regex_from_schema`` returns the same string for both), 129 copies of the pattern's automaton, while the walk
counted the definition once and ``refs_states_refusal`` once more (``[ab]*a[ab]{11}``, 4,097 states: ~528,000 states
admitted under the cap of 16,384). The walk now adds, for a reference met where its schema is written ``n`` times,
``n - 1`` more copies of its target's patterns (their own references followed:
gateway/schema_patterns.py ``subtree_states`` with the schema they resolve in).
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config_http import JsonSchemaLimits
from gateway.response_format import response_format_refusal, tools_refusal

LIMITS = JsonSchemaLimits()
P = "[ab]*a[ab]{6}"  # 129 states; 129 copies: 16,641 > 16,384 (the default since session 31: 8,192)


def _rf(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def _array(items: Any, **defs: Any) -> dict[str, Any]:
    return {"type": "object", "properties": {"a": {"type": "array", "maxItems": 128, "items": items}}, "$defs": defs}


HOSTILE = {
    "def": _array({"$ref": "#/$defs/p"}, p={"type": "string", "pattern": P}),
    "def_object": _array({"$ref": "#/$defs/q"}, q={"type": "object", "properties": {"s": {"type": "string",
                                                                                         "pattern": P}}}),
    "def_to_def": _array({"$ref": "#/$defs/q"}, q={"$ref": "#/$defs/p"}, p={"type": "string", "pattern": P}),
    "nested_arrays": {"type": "array", "maxItems": 10, "items": {"$ref": "#/$defs/q"}, "$defs": {
        "q": {"type": "array", "maxItems": 12, "items": {"$ref": "#/$defs/p"}},
        "p": {"type": "string", "pattern": P}}},  # 11 x 13 = 143 copies
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_pattern_reached_through_items_ref_is_counted_per_copy(name: str) -> None:
    err = response_format_refusal(_rf(HOSTILE[name]), LIMITS, {}, 100, "review30")
    assert err is not None and err.record["reason"] == "response_format over limits.json_schema.max_pattern_states"
    err = tools_refusal([{"type": "function", "function": {"name": "f", "parameters": HOSTILE[name]}}], LIMITS, {},
                        100, None, "review30")
    assert err is not None and err.record["reason"] == "tools parameters over limits.json_schema.max_pattern_states"


def test_the_inlined_schema_is_refused_alike() -> None:
    inline = {"type": "object", "properties": {"a": {"type": "array", "maxItems": 128,
                                                     "items": {"type": "string", "pattern": P}}}}
    assert response_format_refusal(_rf(inline), LIMITS, {}, 100, "review30") is not None


@pytest.mark.parametrize("schema", [
    _array({"$ref": "#/$defs/p"}, p={"type": "string", "pattern": r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[a-z]{2,}$"}),
    _array({"$ref": "#/$defs/p"}, p={"type": "object", "properties": {"id": {"type": "string", "pattern": "^[0-9]{4}$"},
                                                                      "n": {"type": "integer"}}}),
    {"type": "array", "items": {"$ref": "#/$defs/node"}, "$defs": {"node": {"type": "object", "properties": {
        "name": {"type": "string", "pattern": "^[a-z]{1,8}$"}, "kids": {"type": "array", "items": {
            "$ref": "#/$defs/node"}}}}}},  # a recursive definition (a cycle: followed once)
])
def test_ordinary_referenced_items_are_admitted(schema: Any) -> None:
    assert response_format_refusal(_rf(schema), LIMITS, {}, 100, "review30") is None
