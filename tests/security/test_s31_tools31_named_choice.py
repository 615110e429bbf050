"""Session 31 (tools31, S31-review31-4): a **named** ``tool_choice`` (``{"type": "function", "function": {"name":
...}}``) makes SGLang compile ``{"type": "array", "minItems": 1, "items": <the tool's member>}``
(``function_call/utils.py`` ``get_json_schema_constraint``; gateway/tool_schemas.py ``sglang_schemas``), which
outlines-core 0.2.14 writes with the item twice (``\\[item(,item){0,}\\]``; checked with ``build_regex_from_schema``:
a pattern of the tool's ``parameters`` appears twice, also with ``maxItems`` 1 (``{0,0}``); a ``parameters`` of two
unconstrained objects: 557,973 characters alone, 1,116,099 as the named array). ``tools_refusal`` counted the named
tool once for ``max_pattern_states`` and its ``parameters`` alone for ``max_regex_chars``: a 2x bypass of both. Now
every tool the choice names (by ``function.name``: SGLang takes the first match, vLLM its last) counts twice in the
states and its SGLang array in the regular expression's estimate; the other tools count once, as before.
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.config_http import JsonSchemaLimits
from gateway.response_format import tools_refusal
from gateway.schema_expansion import regex_chars
from gateway.tool_schemas import sglang_schemas
from tests.support.ordinary_patterns import ORDINARY

LIMITS = JsonSchemaLimits()
HOSTILE = "[ab]*a" + "[ab]" * 11  # 4,228 states counted: once under the default cap of 8,192, twice over it
SECRET = "QQQ_arg"  # a property name: client text


def _tool(name: str, parameters: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def _one(pattern: str) -> dict[str, Any]:
    return {"type": "object", "required": [SECRET], "properties": {SECRET: {"type": "string", "pattern": pattern}}}


def _named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


#: two unconstrained objects (outlines-core's ``depth``): 557,978 characters counted alone, 1,116,195 as SGLang's
#: named array (outlines-core 0.2.14: 557,973 and 1,116,099), around the default ``max_regex_chars`` (1,000,000)
WIDE = {"type": "object", "required": ["x", "y"], "properties": {"x": {"type": "object", "depth": 5},
                                                                 "y": {"type": "object", "depth": 4}}}


def _reason(err: Any) -> str:
    assert err is not None
    return err.record["reason"]


def test_a_named_tool_counts_its_patterns_twice() -> None:
    tools = [_tool("f", _one(HOSTILE))]
    assert tools_refusal(tools, LIMITS, {}, 100, None, "tools31") is None  # once: 4,228
    assert tools_refusal(tools, LIMITS, {}, 100, "auto", "tools31") is None
    err = tools_refusal(tools, LIMITS, {}, 100, _named("f"), "tools31")  # before: None (counted once)
    assert _reason(err) == "tools parameters over limits.json_schema.max_pattern_states"
    assert err is not None and err.param == f"tools.0.function.parameters.properties.{SECRET}.pattern"
    assert err.status == 400 and err.code == "json_schema_too_complex"


def test_a_ref_through_sglangs_array_counts_its_copies() -> None:
    """``#/items/...`` resolves in SGLang's named array (outlines-core 0.2.14: the pattern, ~4,100 DFA states, written 4
    times: 16,500 byte-DFA states; the same pointer in the ``parameters`` alone: "Invalid reference path"). Counted: the
    walk 8,456 (the property's 2 copies), the array with its references inlined 12,684 x 2 (before: 4,228, admitted)."""
    params = {"type": "object", "required": [SECRET, "b"], "properties": {
        SECRET: {"type": "string", "pattern": "[ab]*a" + "[ab]" * 10},  # session 31: one k less for the cap 8,192
        "b": {"$ref": f"#/items/properties/parameters/properties/{SECRET}"}}}
    tools = [_tool("f", params)]
    assert tools_refusal(tools, LIMITS, {}, 100, None, "tools31") is None
    err = tools_refusal(tools, LIMITS, {}, 100, _named("f"), "tools31")
    assert _reason(err) == "tools parameters over limits.json_schema.max_pattern_states"
    assert err is not None and err.param == "tools.0.function.parameters"


def test_a_named_tools_definitions_count_as_compiled() -> None:
    """A ``#/$defs`` reference resolves in the ``parameters`` alone (vLLM's named choice compiles them once; SGLang's
    array holds no ``$defs``: outlines-core refuses the pointer there), so no x2 over the ``parameters``' own root:
    the definition's 4,228 counted states make 12,684 in the walk (its place x2, its reference once more), 8,456
    inlined: admitted; 8,964 counted states: 26,892 in the walk, refused."""
    def tools(k: int) -> list[dict[str, Any]]:
        return [_tool("f", {"type": "object", "$defs": {"p": {"type": "string", "pattern": "[ab]*a" + "[ab]" * k}},
                            "required": [SECRET], "properties": {SECRET: {"$ref": "#/$defs/p"}}})]
    # session 31 (pattern31): the default cap is 8,192, half of 16,384: each k one less, each count about half
    assert tools_refusal(tools(10), LIMITS, {}, 100, _named("f"), "tools31") is None
    err = tools_refusal(tools(11), LIMITS, {}, 100, _named("f"), "tools31")
    assert err is not None and err.param == "tools.0.function.parameters.$defs.p.pattern"


def test_only_the_named_tool_counts_twice() -> None:
    """The other tools are not compiled for this choice: they count once (as under ``auto``), not twice."""
    tools = [_tool("plain", {"type": "object", "properties": {"n": {"type": "integer"}}}), _tool("f", _one(HOSTILE))]
    assert tools_refusal(tools, LIMITS, {}, 100, _named("plain"), "tools31") is None
    assert tools_refusal(tools, LIMITS, {}, 100, _named("absent"), "tools31") is None  # no tool compiled as named
    err = tools_refusal(tools, LIMITS, {}, 100, _named("f"), "tools31")
    assert err is not None and err.param == f"tools.1.function.parameters.properties.{SECRET}.pattern"


def test_every_tool_of_the_named_name_counts_twice() -> None:
    """SGLang compiles the first tool of that name, vLLM's named choice the last: both count twice."""
    plain = {"type": "object", "properties": {"n": {"type": "integer"}}}
    for tools, index in (([_tool("f", plain), _tool("f", _one(HOSTILE))], 1),
                         ([_tool("f", _one(HOSTILE)), _tool("f", plain)], 0)):
        err = tools_refusal(tools, LIMITS, {}, 100, _named("f"), "tools31")
        assert err is not None and err.param == f"tools.{index}.function.parameters.properties.{SECRET}.pattern"


def test_a_named_tool_counts_the_regex_of_sglangs_array() -> None:
    tools = [_tool("f", WIDE)]
    named = sglang_schemas(tools)[1][0]
    assert regex_chars(WIDE, 1 << 62) < LIMITS.max_regex_chars < regex_chars(named, 1 << 62)
    assert tools_refusal(tools, LIMITS, {}, 100, None, "tools31") is None
    err = tools_refusal(tools, LIMITS, {}, 100, _named("f"), "tools31")  # before: None (its parameters alone)
    assert _reason(err) == "tools parameters over limits.json_schema.max_regex_chars"
    assert err is not None and err.param == "tools.0.function.parameters"
    assert "tool_choice" in err.message and SECRET not in err.record["reason"]
    assert tools_refusal(tools, LIMITS, {"max_regex_chars": None}, 100, _named("f"), "tools31") is None


def test_the_tenant_overrides_turn_both_off() -> None:
    tools = [_tool("f", _one(HOSTILE))]
    assert tools_refusal(tools, LIMITS, {"max_pattern_states": None}, 100, _named("f"), "tools31") is None


@pytest.mark.parametrize("choice", [{"type": "function"}, {"function": "f"}, {"function": {"name": 5}}, {}, "none"])
def test_a_malformed_choice_counts_as_before(choice: Any) -> None:
    """No tool named: nothing counted twice (the body's schema check answers the malformed choice)."""
    assert tools_refusal([_tool("f", _one(HOSTILE))], LIMITS, {}, 100, choice, "tools31") is None


def test_ordinary_named_tools_are_admitted() -> None:
    """Each ordinary pattern (tests/support/ordinary_patterns.py) in a named tool; and an agent's tools, one named."""
    from gateway.pattern_quote import pattern_reads_quote
    for name, pattern in ORDINARY.items():
        if pattern_reads_quote(pattern):
            continue
        assert tools_refusal([_tool("f", _one(pattern))], LIMITS, {}, 100, _named("f"), "tools31") is None, name
    quote_free = [p for p in ORDINARY.values() if not pattern_reads_quote(p)]
    agent = [_tool(f"t{i}", _one(p)) for i, p in enumerate(quote_free[:8])]
    for i in range(len(agent)):
        assert tools_refusal(agent, LIMITS, {}, 100, _named(f"t{i}"), "tools31") is None, i
