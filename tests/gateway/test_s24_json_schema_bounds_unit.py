"""Session 24 (S23-fields-2): :func:`gateway.response_format.response_format_refusal`, the bounds on a chat body's
``response_format`` schema (``limits.json_schema``, ``tenants[].json_schema_limits``), without a server.

Before: the module did not exist and :func:`gateway.request.parse_inference_request` forwarded every schema below.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config_http import JsonSchemaLimits, LimitsConfig
from gateway.errors import GatewayError
from gateway.request import parse_inference_request
from gateway.response_format import JSON_SCHEMA_BOUNDS, MAX_PARAM_CHARS, response_format_refusal
from tenancy.registry import TenantConfigError
from tenancy.tenant import parse_tenant

LIMITS = JsonSchemaLimits()
NONE: dict[str, int] = {}


def _rf(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "x", "strict": True, "schema": schema}}


def _refusal(rf: Any, overrides: dict[str, Any] = NONE, body_bytes: int = 1 << 30) -> GatewayError | None:
    return response_format_refusal(rf, LIMITS, overrides, body_bytes)


def test_defaults_and_names() -> None:
    assert LimitsConfig().json_schema == LIMITS
    assert {k: getattr(LIMITS, k) for k in JSON_SCHEMA_BOUNDS} == {
        "max_bytes": 65536, "max_depth": 20, "max_properties": 5000, "max_enum_values": 1000,
        "max_pattern_chars": 1024, "max_tool_schemas_bytes": 262144,  # session 25 (tools)
        "max_regex_chars": 1_000_000,  # session 27 (expand27, S27-review27-3)
        "quote_reading_patterns": "refuse",  # session 29 (pattern29, S29-pattern29-1)
        "max_item_count": 128,  # session 29 (xgrammar29, S29-xgrammar29-1)
        "max_pattern_states": 8192}  # session 31 (pattern31, S31-pattern31-1; 16384 in session 30)
    assert set(JsonSchemaLimits.model_fields) == set(JSON_SCHEMA_BOUNDS)


@pytest.mark.parametrize("rf, param, bound", [
    (_rf({"type": "string", "pattern": "a" * 1025}), "response_format.json_schema.schema.pattern", "max_pattern_chars"),
    (_rf({"anyOf": [{"pattern": "a" * 600}, {"pattern": "b" * 600}]}),
     "response_format.json_schema.schema.anyOf.0.pattern", "max_pattern_chars"),  # together: the one that passes
    (_rf({"enum": [1] * 600, "items": {"enum": [2] * 600}}), None, "max_enum_values"),
    (_rf({"properties": {str(i): {} for i in range(5001)}}), "response_format.json_schema.schema.properties",
     "max_properties"),
    (_rf({"$defs": {"a": {"$defs": {"b": {"properties": {"c": {"items": {}}}}}}}}), None, None),  # 5 levels: fine
    ({"type": "structural_tag", "structures": [{"begin": "<f>", "schema": {"pattern": "x" * 2000}}]},
     "response_format.structures.0.schema.pattern", "max_pattern_chars"),  # another type is walked whole
])
def test_bounds(rf: Any, param: str | None, bound: str | None) -> None:
    err = _refusal(rf)
    if bound is None:
        assert err is None
        return
    assert err is not None and err.status == 400 and err.code == "json_schema_too_complex"
    assert err.client_text and f"limits.json_schema.{bound}" in err.message
    assert err.record == {"reason": f"response_format over limits.json_schema.{bound}"}
    if param is not None:
        assert err.param == param


def test_depth_counts_schema_levels_not_name_maps() -> None:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(19):
        schema = {"type": "object", "properties": {"k": schema}}
    assert _refusal(_rf(schema)) is None  # 20 levels
    err = _refusal(_rf({"type": "array", "items": schema}))
    assert err is not None and err.param == "response_format.json_schema.schema.items" + ".properties.k" * 19
    assert _refusal(_rf({"items": schema}), {"max_depth": 21}) is None  # the tenant's own value wins
    data = {"const": {"a": {"b": {"c": 1}}}}  # objects inside data count as levels too
    assert _refusal(_rf(data), {"max_depth": 3}) is not None and _refusal(_rf(data), {"max_depth": 4}) is None


def test_bytes_are_counted_only_past_the_body_length() -> None:
    rf = _rf({"description": "d" * 70_000})
    assert _refusal(rf, body_bytes=65536) is None  # a body this short cannot hold more (not encoded)
    err = _refusal(rf)
    assert err is not None and err.param == "response_format" and "max_bytes" in err.message
    huge = _rf({"const": 10 ** 19 + 1, "description": "d" * 70_000})  # beyond orjson's 64-bit integers
    assert _refusal(huge) is not None and _refusal(huge, {"max_bytes": 1 << 20}) is None


def test_keys_in_param_are_escaped_and_bounded() -> None:
    name = "a b,\u2603\r\n" + "x" * 500
    err = _refusal(_rf({"properties": {name: {"pattern": "p" * 2000}}}))
    assert err is not None and err.param.isascii() and err.param.isprintable()
    assert "\\u2603" in err.param and "\r" not in err.param
    deep: dict[str, Any] = {"pattern": "p" * 2000}
    for i in range(19):
        deep = {"properties": {"n" * 60 + str(i): deep}}
    err = _refusal(_rf(deep))
    assert err is not None and len(err.param) <= MAX_PARAM_CHARS and err.param.endswith("...")


@pytest.mark.parametrize("rf", [None, "json_object", [1, 2], {"type": "json_object"}, {"type": "text"},
                                _rf(None), _rf([{"pattern": 1}]), {"type": "json_schema", "json_schema": "x"}])
def test_shapes_left_to_the_schema_pass_here(rf: Any) -> None:
    assert _refusal(rf) is None


_json = st.recursive(st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=6),
                     lambda c: st.lists(c, max_size=4)
                     | st.dictionaries(st.sampled_from(["properties", "pattern", "enum", "items", "anyOf", "$defs",
                                                        "patternProperties", "const", "a", "é"]), c, max_size=4),
                     max_leaves=30)


@settings(max_examples=300, deadline=None)
@given(_json, st.integers(1, 6), st.integers(1, 8), st.integers(1, 8), st.integers(0, 12))
def test_any_json_gives_an_answer_or_none(schema: Any, depth: int, props: int, enums: int, chars: int) -> None:
    over = {"max_depth": depth, "max_properties": props, "max_enum_values": enums, "max_pattern_chars": chars}
    err = _refusal(_rf(schema), over)
    if err is not None:
        assert err.param.startswith("response_format") and err.param.isascii() and err.param.isprintable()
    assert _refusal(_rf(schema), {"max_depth": 99, "max_properties": 99, "max_enum_values": 99,
                                  "max_pattern_chars": 999,  # session 29: the quote check reads no size
                                  "quote_reading_patterns": "allow",
                                  "max_pattern_states": None}) is None  # session 30: refuses what it cannot parse


def test_parse_refuses_before_validation_and_counts_the_tenant() -> None:
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       "response_format": _rf({"type": "string", "pattern": "a" * 2000})}).encode()
    with pytest.raises(GatewayError) as got:
        parse_inference_request(body, "chat", json_schema=LIMITS)
    assert got.value.code == "json_schema_too_complex"
    req = parse_inference_request(body, "chat", json_schema=LIMITS, json_schema_tenant={"max_pattern_chars": 2000})
    assert req.body["response_format"]["json_schema"]["schema"]["pattern"] == "a" * 2000
    assert "a" * 2000 in req.extra_text  # and counted in the prompt bytes, as before
    assert parse_inference_request(body, "chat").body  # None: not checked (callers without limits)
    # the schema's values count in max_free_values too (gateway/free_form.py), as before this session
    many = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                       "response_format": _rf({"enum": list(range(500))})}).encode()
    with pytest.raises(GatewayError) as got:
        parse_inference_request(many, "chat", max_free_values=100, json_schema=LIMITS)
    assert got.value.code == "too_many_json_items"


def test_tenant_entry() -> None:
    doc = {"id": "t", "spiffe_ids": ["spiffe://td/t/"], "json_schema_limits": {"max_depth": 4, "max_pattern_chars": 0}}
    assert dict(parse_tenant(doc, 0).json_schema_limits) == {"max_depth": 4, "max_pattern_chars": 0}
    assert dict(parse_tenant({"id": "t", "spiffe_ids": ["spiffe://td/t/"]}, 0).json_schema_limits) == {}
    for bad in ({"max_depth": 0}, {"max_depth": "4"}, {"max_nodes": 4}, {"max_bytes": True}):
        with pytest.raises(TenantConfigError, match="tenants.0.json_schema_limits"):
            parse_tenant({**doc, "json_schema_limits": bad}, 0)
