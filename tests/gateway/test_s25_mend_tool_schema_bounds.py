"""Session 25 (mend, S24-fields-1): each ``tools[].function.parameters`` schema is bounded as a ``response_format``
schema is (``limits.json_schema``, per tenant ``tenants[].json_schema_limits``), and all of them together by
``max_tool_schemas_bytes``: 400 ``json_schema_too_complex`` with ``param`` ``tools.N.function.parameters...``.

The replica compiles a tool's parameters into a grammar too (tool_choice ``required`` / a named function / strict
tools). Before: a tool's parameters were bounded only by ``max_tools``, ``max_free_values`` and the body size; a
20,000-character regex or 50 nested levels in one tool went to the replica's compiler.
"""
from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.config_http import JsonSchemaLimits
from gateway.errors import GatewayError
from gateway.request import parse_inference_request
from gateway.response_format import tools_refusal
from tenancy.tenant import parse_tenant

LIMITS = JsonSchemaLimits()


def _tool(name: str, parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _body(tools: Any, **extra: Any) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": tools,
                       **extra}).encode()


def _nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("parameters, param, bound", [
    ({"type": "object", "properties": {"q": {"type": "string", "pattern": "a" * 1025}}},
     "tools.1.function.parameters.properties.q.pattern", "max_pattern_chars"),
    (_nested(21), None, "max_depth"),
    ({"type": "object", "properties": {f"p{i}": {} for i in range(5001)}}, "tools.1.function.parameters.properties",
     "max_properties"),
    ({"type": "string", "enum": list(range(1001))}, "tools.1.function.parameters.enum", "max_enum_values"),
    ({"type": "object", "description": "x" * 70000}, "tools.1.function.parameters", "max_bytes"),
])
def test_each_tools_parameters_take_the_json_schema_bounds(parameters: Any, param: str | None, bound: str) -> None:
    tools = [_tool("small", {"type": "object", "properties": {"city": {"type": "string"}}}), _tool("big", parameters)]
    with pytest.raises(GatewayError) as got:
        parse_inference_request(_body(tools), "chat", json_schema=LIMITS)
    err = got.value
    assert (err.status, err.code) == (400, "json_schema_too_complex")
    assert f"limits.json_schema.{bound}" in err.message  # the tool is named by ``param`` (counts are shared by tools)
    assert "tools[1].function.parameters" in err.message or "tools[].function.parameters" in err.message
    assert err.param is not None and err.param.startswith("tools.1.function.parameters")
    if param is not None:
        assert err.param == param
    assert err.record["reason"] == f"tools parameters over limits.json_schema.{bound}"  # no client text


def test_the_sum_of_the_tools_schemas_is_bounded_and_a_tenant_may_raise_it() -> None:
    tools = [_tool(f"t{i}", {"type": "object", "description": "d" * 30000}) for i in range(10)]  # 30 KB each
    body = _body(tools)
    with pytest.raises(GatewayError) as got:
        parse_inference_request(body, "chat", json_schema=LIMITS)
    assert got.value.code == "json_schema_too_complex" and "max_tool_schemas_bytes" in got.value.message
    assert got.value.param == "tools.8.function.parameters"  # the 9th passes 262,144 bytes together
    req = parse_inference_request(body, "chat", json_schema=LIMITS, json_schema_tenant={"max_tool_schemas_bytes": 400000})
    assert len(req.body["tools"]) == 10
    assert tools_refusal(tools, LIMITS, {}, body_bytes=1000) is None  # a body this short cannot pass a byte bound


def test_usual_tools_pass_and_shapes_left_to_the_schema_pass_here() -> None:
    weather = _tool("get_weather", {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]})
    assert parse_inference_request(_body([weather]), "chat", json_schema=LIMITS).body["tools"][0] == weather
    for tools in ("x", [1], [{"function": "x"}], [{"function": {"name": "f"}}], [{"function": {"parameters": [1]}}]):
        assert tools_refusal(tools, LIMITS, {}, 1 << 30) is None  # left to the request schema
    # response_format and tools are each bounded on their own
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"pattern": "a" * 1000}}}
    tool = _tool("f", {"type": "string", "pattern": "b" * 1000})
    assert parse_inference_request(_body([tool], response_format=rf), "chat", json_schema=LIMITS).body


def test_tenant_override_of_the_new_bound() -> None:
    doc = {"id": "t", "spiffe_ids": ["spiffe://td/t/"], "json_schema_limits": {"max_tool_schemas_bytes": 1024}}
    assert dict(parse_tenant(doc, 0).json_schema_limits) == {"max_tool_schemas_bytes": 1024}
    tools = [_tool("a", {"type": "object", "description": "x" * 600}), _tool("b", {"description": "y" * 600})]
    err = tools_refusal(tools, LIMITS, {"max_tool_schemas_bytes": 1024}, 1 << 30)
    assert err is not None and err.param == "tools.1.function.parameters"
