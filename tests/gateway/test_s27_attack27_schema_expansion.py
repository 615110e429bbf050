"""Session 27, attack27: four ways the first ``max_regex_chars`` estimate (expand27) counted less than outlines-core
0.2.14 builds. The real lengths quoted were measured with outlines-core's ``build_regex_from_schema`` (bench only,
not a test dependency); here the estimate must reach them, and the default bound must refuse the blow-ups.

* S27-attack27-1: ``#/$defs/`` (an empty name) reached the map's ``""`` entry, but outlines-core drops empty parts
  and builds the ``$defs`` map itself (74 bytes: 28,573,620 characters at ``depth`` 8). Before: counted 4.
* S27-attack27-2: for ``tool_choice: "required"`` the replica compiles ONE wrapper schema with every tool's ``$defs``
  merged and ``#`` meaning the wrapper; the tools were counted each against its own root (4 ``{"$ref": "#"}``
  properties: counted 735,715, built 33,869,441).
* S27-attack27-3: list and object ``const`` / ``enum`` values get outlines-core's whitespace pattern beside every
  structural character (28 ``const`` lists of 1,050 zeros: counted 864,133, built 4,274,353).
* S27-attack27-4: an empty ``anyOf`` / ``oneOf`` builds ``()``: 2 characters, counted 1.
"""
from __future__ import annotations

from typing import Any

import orjson

from gateway.config_http import JsonSchemaLimits
from gateway.response_format import response_format_refusal, tools_refusal
from gateway.schema_expansion import regex_chars, required_schema

BIG = 10 ** 12
LIMITS = JsonSchemaLimits()


def _rf(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


def _tool(name: str, params: dict[str, Any] | None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": name}
    if params is not None:
        fn["parameters"] = params
    return {"type": "function", "function": fn}


def test_a_reference_with_an_empty_name_counts_the_map_it_reaches() -> None:
    for depth, built in ((6, 1_785_780), (8, 28_573_620)):
        schema = {"$defs": {"": {"type": "null"}, "type": "object", "depth": depth}, "$ref": "#/$defs/"}
        assert regex_chars(schema, BIG) >= built  # before: 4
    schema = {"$defs": {"": {"type": "null"}, "type": "object", "depth": 8}, "$ref": "#/$defs/"}
    assert len(orjson.dumps(schema)) < 80
    err = response_format_refusal(_rf(schema), LIMITS, {}, 100)
    assert err is not None and err.record == {"reason": "response_format over limits.json_schema.max_regex_chars"}
    named = {"$defs": {"x": {"type": "null"}}, "$ref": "#/$defs/x"}  # an ordinary name still resolves at once
    assert regex_chars(named, BIG) == regex_chars({"type": "null"}, BIG)


def test_required_counts_the_one_schema_the_replica_compiles() -> None:
    a = _tool("a", {"type": "object", "properties": {f"p{i}": {"$ref": "#/$defs/big"} for i in range(4)}})
    b = _tool("b", {"type": "object", "properties": {}, "$defs": {"big": {"type": "object", "depth": 4}}})
    wrapper = required_schema([a, b])
    assert wrapper["$defs"] == {"big": {"type": "object", "depth": 4}}  # merged at the top, as vLLM does
    assert "$defs" not in wrapper["items"]["anyOf"][1]["properties"]["parameters"]
    assert regex_chars(wrapper, BIG) >= 2_231_569  # built; before: the sum counted 837
    err = tools_refusal([a, b], LIMITS, {}, 100, "required")
    assert err is not None and err.param == "tools"
    assert tools_refusal([a, b], LIMITS, {}, 100, "auto") is None  # no wrapper compiled: each tool alone passes
    root = _tool("a", {"type": "object", "properties": {f"p{i}": {"$ref": "#"} for i in range(3)}})
    assert regex_chars(required_schema([root]), BIG) >= 4_531_719  # ``#`` is the wrapper; before: 100,725
    bare = [_tool(f"t{i}", None) for i in range(64)]
    assert regex_chars(required_schema(bare), BIG) >= 9_739  # the default parameters counted; before: 71


def test_structured_const_and_enum_values_count_their_whitespace() -> None:
    for value, built in (([0] * 50, 503), ([], 12), ({}, 12), ([{"a": 1, "b": [1, 2]}] * 5, 393)):
        assert regex_chars({"const": value}, BIG) >= built, value
    assert regex_chars({"enum": [{"type": "null"}]}, BIG) >= 35
    scaled = {"type": "object", "properties": {f"p{i}": {"const": [0] * 1050} for i in range(28)}}
    assert len(orjson.dumps(scaled)) < 65_536
    assert regex_chars(scaled, BIG) >= 4_274_353  # before: 864,133
    assert response_format_refusal(_rf(scaled), LIMITS, {}, 100) is not None


def test_an_empty_any_of_or_one_of_builds_two_characters() -> None:
    assert regex_chars({"anyOf": []}, BIG) >= 2 and regex_chars({"oneOf": []}, BIG) >= 2
