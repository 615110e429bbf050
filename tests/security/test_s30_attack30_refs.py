"""Session 30 (attack30): ``$ref`` targets the bounds walk did not walk, although a grammar compiler compiles them.

S30-attack30-1: xgrammar 0.2.9 resolves ``#/...`` by percent-decoding the whole fragment first (so ``%2F`` splits
parts), then splitting on ``/`` and unescaping ``~1`` / ``~0`` in each part, looking up only that decoded key.
gateway/schema_refs.py took a part as written first (outlines-core's way), so a key spelled both ways reached a
harmless node for the walk and a ``minItems`` 5000 (``max_item_count``) under ``default`` for xgrammar: forwarded.

S30-attack30-2: vLLM's ``tool_choice: "required"`` compiles ONE schema of all tools (an ``anyOf`` under ``items``,
every tool's ``$defs`` merged at its top), where ``#/$defs/holder/default`` of one tool reaches another tool's
``$defs`` (outlines-core and xgrammar) and ``#/items/anyOf/1/...`` another tool's ``parameters`` (xgrammar); SGLang
builds the same with each tool's ``parameters`` whole, and an array of one tool for a named ``tool_choice``. Each
tool's references were resolved inside that tool only: a quote-reading ``pattern`` (kills an outlines-core replica)
and a ``minItems`` 5000 hidden under another tool's ``default`` were forwarded.

Each: 400 ``json_schema_too_complex`` naming the bound, nothing forwarded, one audit event ``rejected`` whose text
holds none of the schema's names.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.config_http import JsonSchemaLimits
from gateway.response_format import tools_refusal
from gateway.schema_refs import unwalked_targets

from tests.hostile.conftest import capture, n_replicas  # noqa: F401 - fixtures
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.schema_http import PATH, config_overrides, forwarded, refused  # noqa: F401 - fixture
from tests.support.schema_http import chat as _chat, request_event as _event, rf as _rf

SECRET = "QQQ_launch_\u2603"  # client text (a property name): never in the audit event
S = "response_format.json_schema.schema"
INT = {"type": "integer"}
MANY = {"type": "array", "minItems": 5000, "items": {"type": "integer"}}
DOT = {"type": "string", "pattern": "^.{1,200}$"}


def _behind(ref: str, default: Any) -> dict[str, Any]:
    return {"type": "object", "required": [SECRET], "properties": {SECRET: {"$ref": ref}}, "default": default}


#: (reference, the schema's ``default``): the walk's old target is ``INT``, xgrammar 0.2.9's is ``MANY``
#: (checked with ``xgrammar.Grammar.from_json_schema``: ``default_..._items{4999, -1}``)
DECODED = {
    "tilde-1": ("#/default/a~1b", {"a~1b": INT, "a/b": MANY}),
    "tilde-0": ("#/default/a~0b", {"a~0b": INT, "a~b": MANY}),
    "percent": ("#/default/%61", {"%61": INT, "a": MANY}),
    "percent-slash": ("#/default/a%2Fb", {"a%2Fb": INT, "a": {"b": MANY}}),
    "percent-percent": ("#/default/a%2561", {"a%2561": INT, "a%61": MANY}),
}


@pytest.mark.parametrize("form", sorted(DECODED))
async def test_a_pointer_xgrammar_decodes_is_walked_at_its_decoded_target(
        stack: Any, capture: Any, audit_log: ListLog, form: str) -> None:  # noqa: F811
    ref, default = DECODED[form]
    r = await stack.client.post(PATH, json=_chat(**_rf(_behind(ref, default))), headers=stack.auth())
    err = refused(r, capture, "max_item_count")
    assert err["param"].startswith(f"{S}.properties.") and err["param"].endswith(".$ref.minItems")
    event = _event(audit_log)
    assert (event.status_code, event.outcome.value) == (400, "rejected")
    assert event.policy.reason == "response_format over limits.json_schema.max_item_count"
    assert "QQQ" not in json.dumps(event.to_dict())


async def test_ordinary_escaped_pointers_are_forwarded(stack: Any, capture: Any) -> None:
    schemas = [
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/a~1b"}}, "$defs": {"a/b": {"type": "integer"}}},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/caf%C3%A9"}},
         "$defs": {"caf\u00e9": {"type": "array", "maxItems": 8}}},
        _behind("#/default/a~1b", {"a~1b": INT, "a/b": {"type": "array", "minItems": 3}}),
    ]
    await forwarded(stack, capture, schemas)


def _two_tools(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    return _chat(tool_choice="required", tools=[
        {"type": "function", "function": {"name": "f", "parameters": first}},
        {"type": "function", "function": {"name": "g", "parameters": second}}])


async def test_a_reference_into_another_tools_defs_is_walked(
        stack: Any, capture: Any, audit_log: ListLog) -> None:  # noqa: F811
    """outlines-core builds ``("^.{1,200}")`` for tool f's property from the merged ``$defs`` (checked with
    ``build_regex_from_schema`` on vLLM's ``required`` schema)."""
    first = {"type": "object", "required": [SECRET], "properties": {SECRET: {"$ref": "#/$defs/holder/default"}}}
    second = {"type": "object", "properties": {}, "$defs": {"holder": {"type": "object", "default": DOT}}}
    r = await stack.client.post(PATH, json=_two_tools(first, second), headers=stack.auth())
    err = refused(r, capture, "quote_reading_patterns")
    assert err["param"].startswith("tools.0.function.parameters.properties.") and err["param"].endswith(".pattern")
    event = _event(audit_log)
    assert event.policy.reason == "tools parameters over limits.json_schema.quote_reading_patterns"
    assert "QQQ" not in json.dumps(event.to_dict())


async def test_a_reference_into_another_tools_parameters_is_walked(stack: Any, capture: Any) -> None:
    """xgrammar reads list indexes: ``#/items/anyOf/1/properties/parameters/default`` is tool g's ``default``."""
    first = {"type": "object", "required": [SECRET],
             "properties": {SECRET: {"$ref": "#/items/anyOf/1/properties/parameters/default"}}}
    second = {"type": "object", "properties": {}, "default": MANY}
    r = await stack.client.post(PATH, json=_two_tools(first, second), headers=stack.auth())
    err = refused(r, capture, "max_item_count")
    assert err["param"].endswith(".$ref.minItems")


async def test_a_reference_through_sglangs_named_choice_array_is_walked(stack: Any, capture: Any) -> None:
    """SGLang compiles a named ``tool_choice`` as ``{"type": "array", "minItems": 1, "items": {"properties": {"name":
    ..., "parameters": <the tool's parameters>}, ...}}``: ``#/items/properties/parameters/default`` is the tool's
    own ``default``, which the walk read as data."""
    params = {"type": "object", "required": [SECRET],
              "properties": {SECRET: {"$ref": "#/items/properties/parameters/default"}}, "default": MANY}
    body = _chat(tool_choice={"type": "function", "function": {"name": "f"}},
                 tools=[{"type": "function", "function": {"name": "f", "parameters": params}}])
    r = await stack.client.post(PATH, json=body, headers=stack.auth())
    err = refused(r, capture, "max_item_count")
    assert err["param"].endswith(".$ref.minItems")


async def test_a_reference_into_another_tools_own_defs_in_sglangs_required_array_is_walked(
        stack: Any, capture: Any) -> None:
    """SGLang's ``required`` schema keeps each tool's ``parameters`` whole, its ``$defs`` included:
    ``#/items/anyOf/1/properties/parameters/$defs/holder/default`` reaches tool g's data."""
    first = {"type": "object", "required": [SECRET],
             "properties": {SECRET: {"$ref": "#/items/anyOf/1/properties/parameters/$defs/holder/default"}}}
    second = {"type": "object", "properties": {}, "$defs": {"holder": {"type": "object", "default": DOT}}}
    r = await stack.client.post(PATH, json=_two_tools(first, second), headers=stack.auth())
    err = refused(r, capture, "quote_reading_patterns")
    assert err["param"].endswith(".pattern")


async def test_ordinary_tools_with_references_are_forwarded(stack: Any, capture: Any) -> None:
    """References to the wrapper itself (``#``: recursion) and to another tool's ``$defs``: forwarded."""
    first = {"type": "object", "properties": {"next": {"$ref": "#"}, "w": {"$ref": "#/$defs/word"}}}
    second = {"type": "object", "properties": {"v": {"$ref": "#/$defs/word"}},
              "$defs": {"word": {"type": "string", "pattern": "^[a-z]{1,8}$"}}}
    body = _two_tools(first, second)
    r = await stack.client.post(PATH, json=body, headers=stack.auth())
    assert r.status_code == 200, r.text
    assert [seen.body["tools"] for seen in capture.seen] == [body["tools"]]


def test_the_wrapper_counts_nothing_twice() -> None:
    """Resolving references inside vLLM's ``required`` wrapper too walks only what no tool root walked: two tools
    of 3 properties each, both referring to ``#`` (the wrapper) and to the first's parameters through it, pass a
    tenant bound of exactly 6 properties and 6 schema levels (walked twice they would hold 12 and more levels)."""
    first = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"$ref": "#"},
                                              "c": {"$ref": "#/items/anyOf/0/properties/parameters"}}}
    second = {"type": "object", "properties": {"d": {"$ref": "#"}, "e": {"$ref": "#/items"},
                                               "f": {"$ref": "#/items/anyOf/1"}}}
    tools = [{"type": "function", "function": {"name": n, "parameters": p}} for n, p in (("f", first), ("g", second))]
    tight = {"max_properties": 6, "max_depth": 2, "max_regex_chars": None}
    assert tools_refusal(tools, JsonSchemaLimits(), tight, 1 << 30, "required") is None
    assert tools_refusal(tools, JsonSchemaLimits(), {**tight, "max_properties": 5}, 1 << 30, "required") is not None


def test_unwalked_targets_hands_back_each_compilers_target_once() -> None:
    """gateway/schema_refs.py: outlines-core's target (the key as written) and xgrammar's (percent-decoded whole,
    then RFC 6901-unescaped), each once, none already walked."""
    as_written, decoded, nested = {"type": "integer"}, {"type": "string"}, {"type": "null"}
    root = {"default": {"a~1b": as_written, "a/b": decoded, "x%2Fy": as_written, "x": {"y": nested}}}
    assert [n for n, _ in unwalked_targets([(root, ("#/default/a~1b",))], set())] == [as_written, decoded]
    assert [n for n, _ in unwalked_targets([(root, ("#/default/x%2Fy",))], set())] == [as_written, nested]
    assert unwalked_targets([(root, ("#/default/a~1b",))], {id(as_written), id(decoded)}) == []
    assert [n for n, _ in unwalked_targets([(root, ("#/default/a~1b",)), (root, ("#/default/a~1b",))],
                                           set())] == [as_written, decoded]
