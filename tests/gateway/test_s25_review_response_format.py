"""Session 25 review of gateway/response_format.py (session 24's ``limits.json_schema`` bounds).

S25-review-1: a ``response_format`` nested deeper than orjson encodes (255 levels) in a body longer than
``max_bytes`` fell back to :func:`json.dumps`, whose ``RecursionError`` (about 1,000 levels) escaped
:func:`gateway.request.parse_inference_request`: an authenticated tenant got 500 ``internal_error`` and a
traceback in the gateway's log for each such body. After: 400 ``invalid_json`` (the decoder's own "nested too
deeply"), as any body nested deeper than ``limits.max_json_depth`` answers.

S25-review-2: the walk copied the whole path tuple for every value it pushed (``where + (key,)``), so its work was
values x nesting depth: a 61 KiB ``response_format`` of 31,000 zeros 250 lists deep cost ~57 ms of CPU on the
2-core review machine (its decode: 0.3 ms). After: each pushed value links to its parent (O(1)), scalars are not
pushed, and the path is spelled out only for a refusal. Counted here by the number of tuple elements the walk
allocates (no timing): bounded by a small multiple of the values, whatever the depth.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import orjson
import pytest

from gateway.config_http import JsonSchemaLimits, LimitsConfig
from gateway.errors import GatewayError
from gateway.request import parse_inference_request
from gateway.response_format import response_format_refusal

LIMITS = JsonSchemaLimits()


def _body(schema_text: str, pad: int) -> bytes:
    return ('{"model":"m","messages":[{"role":"user","content":"' + "a " * pad + '"}],'
            '"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"x":' + schema_text +
            '}}}}').encode()


@pytest.mark.parametrize("depth", [300, 1000])
def test_deep_response_format_in_a_long_body_is_a_400_not_a_crash(depth: int) -> None:
    raw = _body("[" * depth + "0" + "]" * depth, pad=40000)  # longer than max_bytes: the byte count runs
    assert len(raw) > LIMITS.max_bytes
    with pytest.raises(GatewayError) as info:
        parse_inference_request(raw, "chat", LimitsConfig().max_json_depth, json_schema=LIMITS)
    assert info.value.status == 400 and info.value.code == "invalid_json"


def test_deep_response_format_refusal_itself_raises_nothing() -> None:
    nested: list[Any] = []
    for _ in range(100_000):  # deeper than json.dumps encodes under any recursion limit a test run sets
        nested = [nested]
    rf = {"type": "json_schema", "json_schema": {"schema": {"x": nested}}}
    err = response_format_refusal(rf, LIMITS, {}, 1 << 30)
    assert err is not None and err.status == 400 and err.code == "invalid_json"


def _walk_allocations(rf: Any) -> int:
    """Bytes the walk allocates at its peak (tracemalloc), for ``rf`` already decoded."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        assert response_format_refusal(rf, LIMITS, {}, 0) is None
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_walk_work_does_not_grow_with_depth_times_values() -> None:
    values = 3000

    def rf(depth: int) -> Any:
        return orjson.loads('{"type":"json_schema","json_schema":{"schema":{"x":' + "[" * depth +
                            ",".join(["[0]"] * values) + "]" * depth + "}}}")

    shallow, deep = _walk_allocations(rf(2)), _walk_allocations(rf(200))
    # path tuples of ~200 pointers per value: ~5 MB at depth 200 before the fix; now about the same as shallow
    assert deep < shallow + 200 * 1024, (shallow, deep)


def test_refusal_param_still_names_the_full_path() -> None:
    schema = {"anyOf": [{"items": [[{"properties": {"a b": {"pattern": "x" * 2000}}}]]}]}
    err = response_format_refusal({"type": "json_schema", "json_schema": {"schema": schema}}, LIMITS, {}, 0)
    assert err is not None and err.code == "json_schema_too_complex"
    assert err.param == 'response_format.json_schema.schema.anyOf.0.items.0.0.properties.a b.pattern'


# S25-review-3: vLLM compiles the tools' parameters of a forced tool call (tool_choice "required" or a named
# function) into a grammar as it compiles a response_format (docs/features/tool_calling.md); before, a schema
# refused in response_format was forwarded as a tool's parameters. Merged with S24-fields-1 (mend): every tool's
# parameters are bounded whatever tool_choice says (strict tools are compiled under "auto" too; fail closed).

_HEAVY = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(a|b)*" * 300}}}


def _tools_body(tool_choice: Any, parameters: Any = _HEAVY, tools: int = 2) -> bytes:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [
        {"type": "function", "function": {"name": f"f{i}", "parameters": {"type": "object"}}} for i in range(tools)]}
    body["tools"][-1]["function"]["parameters"] = parameters
    if tool_choice is not None:
        body["tool_choice"] = tool_choice
    return orjson.dumps(body)


def _parse(raw: bytes) -> Any:
    return parse_inference_request(raw, "chat", LimitsConfig().max_json_depth, json_schema=LIMITS)


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "f0"}}])
def test_forced_tool_call_parameters_are_bounded(tool_choice: Any) -> None:
    with pytest.raises(GatewayError) as info:
        _parse(_tools_body(tool_choice))
    err = info.value
    assert err.status == 400 and err.code == "json_schema_too_complex" and err.client_text
    assert err.param == "tools.1.function.parameters.properties.a.pattern"
    assert "limits.json_schema.max_pattern_chars" in err.message
    assert err.record == {"reason": "tools parameters over limits.json_schema.max_pattern_chars"}


@pytest.mark.parametrize("tool_choice", [None, "auto", "none"])
def test_unforced_tool_calls_are_bounded_too(tool_choice: Any) -> None:
    with pytest.raises(GatewayError) as info:
        _parse(_tools_body(tool_choice))
    assert info.value.code == "json_schema_too_complex"
    assert info.value.param == "tools.1.function.parameters.properties.a.pattern"
    light = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+$"}}}
    assert _parse(_tools_body(tool_choice, light)).body["tools"][1]["function"]["parameters"] == light


def test_forced_tool_call_counts_are_shared_across_tools_and_tenant_overrides_apply() -> None:
    wide = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(3000)}}
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": "required",
                        "tools": [{"type": "function", "function": {"name": f"f{i}", "parameters": wide}}
                                  for i in range(2)]})
    with pytest.raises(GatewayError) as info:  # 6000 properties together > 5000
        parse_inference_request(raw, "chat", 32, json_schema=LIMITS, json_schema_tenant={"max_bytes": 1 << 20})
    assert info.value.code == "json_schema_too_complex" and "max_properties" in info.value.message
    assert parse_inference_request(raw, "chat", 32, json_schema=LIMITS,  # session 27: an xgrammar tenant (no regex)
                                   json_schema_tenant={"max_bytes": 1 << 20, "max_properties": 6000,
                                                       "max_regex_chars": None}).model == "m"
    with pytest.raises(GatewayError) as info:  # session 27: 3,000 optional properties, quadratic in outlines-core
        parse_inference_request(raw, "chat", 32, json_schema=LIMITS,
                                json_schema_tenant={"max_bytes": 1 << 20, "max_properties": 6000})
    assert "limits.json_schema.max_regex_chars" in info.value.message
    with pytest.raises(GatewayError) as info:  # one tool's parameters are over max_bytes (the body is longer)
        parse_inference_request(raw, "chat", 32, json_schema=LIMITS)
    assert info.value.param == "tools.0.function.parameters" and "limits.json_schema.max_bytes" in info.value.message


# S25-review-5: local $ref multiply once inlined (outlines-core's build_regex_from_schema inlines every reference);
# before, a 20-definition chain, each referring to the next twice (~1.3 KB, 3 schema levels), passed every bound.

def _doubling(n: int) -> dict[str, Any]:
    defs: dict[str, Any] = {f"d{i}": {"type": "object", "properties": {
        "a": {"$ref": f"#/$defs/d{i + 1}"}, "b": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(n)}
    defs[f"d{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def test_references_that_multiply_once_inlined_pass_max_bytes() -> None:
    schema = _doubling(20)
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert len(orjson.dumps(rf)) < 2048
    err = response_format_refusal(rf, LIMITS, {}, 0)
    assert err is not None and err.code == "json_schema_too_complex" and "$ref are inlined" in err.message
    assert err.param == "response_format.json_schema.schema"
    assert err.record == {"reason": "response_format over limits.json_schema.max_bytes"}
    assert response_format_refusal(rf, LIMITS, {"max_bytes": 1 << 30}, 0) is None  # the tenant's own bound
    with pytest.raises(GatewayError) as info:  # a forced tool call's parameters too
        _parse(_tools_body("required", schema))
    assert info.value.param == "tools.1.function.parameters" and "$ref are inlined" in info.value.message


@pytest.mark.parametrize("schema", [
    {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"},
                                                          "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}}},
     "$ref": "#/$defs/node"},  # recursion: counted once
    {"definitions": {"a/b": {"type": "string"}}, "properties": {f"p{i}": {"$ref": "#/definitions/a~1b"}
                                                                 for i in range(50)}},
    {"$defs": {"a": {"type": "string"}}, "$ref": "https://example.com/remote"},  # not local: the replica's
])
def test_ordinary_and_recursive_references_pass(schema: Any) -> None:
    assert response_format_refusal({"type": "json_schema", "json_schema": {"schema": schema}}, LIMITS, {}, 0) is None


def test_inlined_bytes_counts_each_reference_once_per_occurrence() -> None:
    from gateway.schema_refs import inlined_bytes

    a = {"type": "string", "maxLength": 5}
    schema = {"$defs": {"a~/": a}, "properties": {"x": {"$ref": "#/$defs/a~0~1"}, "y": {"$ref": "#/$defs/a~0~1/x"}}}
    size = lambda v: len(orjson.dumps(v))  # noqa: E731
    assert inlined_bytes(schema, size, 1 << 20) == size(schema) + 2 * size(a)
    assert inlined_bytes(schema, size, 10) == 11  # capped
    assert inlined_bytes({"properties": {"x": {"$ref": "#/$defs/a"}}}, size, 1 << 20) == 0  # no definitions
