"""Session 27 (expand27, S27-review27-3): :func:`gateway.schema_expansion.regex_chars`, an upper bound of the regular
expression outlines-core builds from a schema, and ``limits.json_schema.max_regex_chars`` (default 1,000,000) in
gateway/response_format.py, without a server.

Before: the gateway bounded only JSON bytes; 400 optional integer properties (10 KB), 6 nested objects of 5 optional
properties (816 bytes) and 16 nested arrays (418 bytes) were accepted at the default limits, and outlines-core 0.2.14
built 3,647,405 / 2,386,585 / 3,211,234 characters from them (review27's bench). The exact figures asserted below
are outlines-core 0.2.14's own (measured by bench/s27_expand27_estimate.py; outlines-core is not a test dependency).
"""

from __future__ import annotations

import pytest

from gateway.config_http import JsonSchemaLimits
from gateway.response_format import response_format_refusal, tools_refusal
from gateway.schema_expansion import regex_chars, required_tools_chars
from tenancy.registry import TenantConfigError
from tenancy.tenant import parse_tenant
from tests.support.ordinary_schemas import ORDINARY

#: session 29 (pattern29, S29-pattern29-1): quote_reading_patterns off here (this file bounds max_regex_chars);
#: create_contact's ``format: uri`` kills outlines-core and is refused by it at the default
LIMITS = JsonSchemaLimits(quote_reading_patterns="allow")
DEFAULT = 1_000_000
BIG = 1 << 60


def _optional(n: int, value: object = None) -> dict:
    return {"type": "object", "properties": {f"p{i}": value or {"type": "integer"} for i in range(n)}}


def _nested_optional(levels: int, k: int) -> dict:
    s: dict = {"type": "integer"}
    for _ in range(levels):
        s = {"type": "object", "properties": {"n": s, **{f"p{i}": {"type": "integer"} for i in range(k - 1)}}}
    return s


def _arrays(levels: int) -> dict:
    s: dict = {"type": "integer"}
    for _ in range(levels):
        s = {"type": "array", "items": s}
    return s


def _self_root(k: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"$ref": "#"} for i in range(k)}}


def _rf(schema: object) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}


# outlines-core 0.2.14's lengths (build_regex_from_schema, default whitespace): the estimate is exact on these
EXACT = [
    ({}, 13_879), ({"type": "object"}, 6_900), ({"type": "array"}, 6_832), ({"type": "string"}, 43),
    ({"type": "object", "depth": 5}, 446_388), ({"type": "array", "depth": 4}, 111_472),
    ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, 26), ({"oneOf": [{"type": "integer"}, {"type": "null"}]}, 34),
    ({"type": ["integer", "null"]}, 34), ({"prefixItems": [{"type": "integer"}, {"type": "null"}]}, 44),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}, 125),
    (_self_root(3), 50_257),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, 172),
]


@pytest.mark.parametrize(("schema", "built"), EXACT)
def test_the_estimate_is_outlines_cores_length_on_its_building_blocks(schema: dict, built: int) -> None:
    assert regex_chars(schema, BIG) == built


@pytest.mark.parametrize(("schema", "built"), [
    (_optional(400), 3_647_405), (_nested_optional(6, 5), 2_386_585), (_arrays(16), 3_211_234),
    (_self_root(6), 6_933_223)])
def test_the_known_blow_ups_are_never_under_estimated_and_are_refused(schema: dict, built: int) -> None:
    assert regex_chars(schema, BIG) >= built
    # the cycle is refused by max_bytes first (S27-review27-1's unrolled count): with it raised, by this bound
    err = response_format_refusal(_rf(schema), LIMITS, {"max_bytes": 1 << 30}, 100)
    assert err is not None and err.code == "json_schema_too_complex"  # before: None (accepted)
    assert err.record == {"reason": "response_format over limits.json_schema.max_regex_chars"}
    assert err.param == "response_format.json_schema.schema"
    assert "limits.json_schema.max_regex_chars" in err.message


def test_optional_properties_grow_monotonically_and_quadratically() -> None:
    counts = [regex_chars(_optional(n), BIG) for n in range(0, 201, 10)]
    assert counts == sorted(counts) and len(set(counts)) == len(counts)
    assert regex_chars(_optional(200), BIG) >= 3.9 * regex_chars(_optional(100), BIG)
    required = {**_optional(200), "required": ["p0"]}  # one required property: each written once (linear)
    assert regex_chars(required, BIG) < 2.1 * regex_chars({**_optional(100), "required": ["p0"]}, BIG)


def test_each_array_level_at_least_doubles() -> None:
    counts = [regex_chars(_arrays(k), BIG) for k in range(12)]
    assert all(b >= 2 * a for a, b in zip(counts, counts[1:]))


def test_a_large_depth_on_a_bare_object_is_counted_not_walked() -> None:
    assert regex_chars({"type": "object", "depth": 7}, BIG) >= 4 ** 2 * 446_388
    assert regex_chars({"type": "object", "depth": 10 ** 18}, DEFAULT) == DEFAULT + 1


def test_reference_cycles_unroll_to_four_levels_and_terminate() -> None:
    counts = [regex_chars(_self_root(k), BIG) for k in range(1, 9)]
    assert counts == sorted(counts)
    assert counts[7] >= 2 ** 4 * counts[3]  # k**4 copies
    two = {name: {"type": "object", "properties": {"x": {"$ref": f"#/$defs/{to}"}, "y": {"$ref": f"#/$defs/{to}"}}}
           for name, to in (("a", "b"), ("b", "a"))}
    mutual = {"$defs": two, "$ref": "#/$defs/a"}
    assert 0 < regex_chars(mutual, BIG) < BIG
    assert regex_chars({"allOf": [{"$ref": "#"}]}, BIG) == 0  # outlines-core refuses it: nothing built


def test_the_count_stops_past_the_cap() -> None:
    assert regex_chars(_optional(400), 1000) == 1001
    assert regex_chars(_optional(3), 1000) <= 1000


def test_property_order_does_not_lower_the_count() -> None:
    big, small = {}, {"type": "null"}
    first = {"type": "object", "properties": {"a": big, "b": small}}
    last = {"type": "object", "properties": {"b": small, "a": big}}
    assert regex_chars(first, BIG) == regex_chars(last, BIG) >= 27_830  # outlines-core, "a" first: 27,830


@pytest.mark.parametrize("name", list(ORDINARY))
def test_ordinary_schemas_pass_the_default(name: str) -> None:
    schema = ORDINARY[name]
    assert regex_chars(schema, BIG) <= 150_000  # the largest: 60 optional properties, 131,150
    assert response_format_refusal(_rf(schema), LIMITS, {}, 100) is None
    tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    assert tools_refusal(tools, LIMITS, {}, 100) is None


def test_all_ordinary_schemas_as_one_bodys_tools_pass_the_default() -> None:
    tools = [{"type": "function", "function": {"name": k.split()[0], "parameters": v}} for k, v in ORDINARY.items()]
    together = required_tools_chars([(t["function"]["name"], regex_chars(t["function"]["parameters"], BIG))
                                     for t in tools])
    assert 2 * sum(regex_chars(v, BIG) for v in ORDINARY.values()) < together <= 650_000
    assert tools_refusal(tools, LIMITS, {}, 100) is None
    twice = tools * 2  # 26 tools, about 1.2 M characters as tool_choice "required"
    err = tools_refusal(twice, LIMITS, {}, 100)
    assert err is not None and (err.param, err.record["reason"]) == (
        "tools", "tools parameters over limits.json_schema.max_regex_chars")
    assert tools_refusal(twice, LIMITS, {}, 100, "required") is not None
    # session 27 (lead): only "required" builds the one schema of every tool; an agent's 26 tools under "auto",
    # no tool_choice, "none" or a named function are checked one by one (each passes)
    for choice in ("auto", None, "none", {"type": "function", "function": {"name": "get_weather"}}):
        assert tools_refusal(twice, LIMITS, {}, 100, choice) is None, choice
    wide = [*twice, {"type": "function", "function": {"name": "wide", "parameters": _arrays(16)}}]
    err = tools_refusal(wide, LIMITS, {}, 100, "auto")  # one tool over the bound: refused whatever the choice
    assert err is not None and err.param == f"tools.{len(twice)}.function.parameters"


def test_a_tool_over_the_bound_names_its_parameters() -> None:
    tools = [{"type": "function", "function": {"name": "ok", "parameters": ORDINARY["get_weather"]}},
             {"type": "function", "function": {"name": "wide", "parameters": _arrays(16)}}]
    err = tools_refusal(tools, LIMITS, {}, 100)
    assert err is not None and err.param == "tools.1.function.parameters"
    assert err.record == {"reason": "tools parameters over limits.json_schema.max_regex_chars"}


def test_a_tenant_override_and_null_turn_it_off() -> None:
    assert response_format_refusal(_rf(_optional(400)), LIMITS, {"max_regex_chars": None}, 100) is None
    assert response_format_refusal(_rf(_optional(400)), JsonSchemaLimits(max_regex_chars=None), {}, 100) is None
    narrow = response_format_refusal(_rf(ORDINARY["create_contact (15 optional)"]), LIMITS, {"max_regex_chars": 10_000},
                                      100)
    assert narrow is not None and "more than 10000 characters" in narrow.message
    doc = {"id": "t", "spiffe_ids": ["spiffe://td/t/"]}
    assert dict(parse_tenant({**doc, "json_schema_limits": {"max_regex_chars": None}}, 0).json_schema_limits) == {
        "max_regex_chars": None}
    assert dict(parse_tenant({**doc, "json_schema_limits": {"max_depth": 3}}, 0).json_schema_limits) == {"max_depth": 3}
    with pytest.raises(TenantConfigError) as got:
        parse_tenant({**doc, "json_schema_limits": {"max_regex_chars": 0}}, 0)
    assert "max_regex_chars to a positive integer or null" in str(got.value)
