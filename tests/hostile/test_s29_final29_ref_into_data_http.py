"""Session 29 (final29, S29-final29-1): the bounds walk of gateway/response_format.py reads the values of ``enum``,
``const``, ``default`` and ``examples`` as data and a ``$defs`` map as names, but outlines-core 0.2.14 and xgrammar
0.2.9 resolve a ``$ref`` pointer to any node of the schema and compile its target as a schema. A schema hidden
under ``default`` (or under a property named ``default`` of a ``$defs`` map reached as ``#/$defs``) and referred to
by ``$ref`` was forwarded unchecked: a ``pattern`` of ``.`` (``quote_reading_patterns``: kills an outlines-core
replica, S28-pattern28-2) and a ``minItems`` of 5000 (``max_item_count``, xgrammar) both answered 200 before the fix.
Now the target is walked as a schema: 400 ``json_schema_too_complex``, nothing forwarded, one audit event
``rejected`` without the schema's text; an ordinary ``#/$defs/<name>`` reference is still forwarded.

S29-final29-6: the same inside a ``structural_tag``'s ``structures[].schema``, which xgrammar compiles as a
schema of its own (its ``#/default`` is its own ``default``).

S29-final29-3: ``minContains`` n beside ``items`` is compiled by xgrammar 0.2.9 into exactly the grammar of
``minItems`` n (``root_items{n-1, -1}``), which ``max_item_count`` did not bound (200 before the fix).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import TD
from tests.hostile.conftest import stable_master_secret
from tests.hostile.test_s27_review27_schema_refs_http import PATH, _chat, _event, _rf, _tools
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

SECRET = "launch_code_1234"  # client text (a property name): never in the audit event
S = "response_format.json_schema.schema"
DOT = {"type": "string", "pattern": "^.{1,200}$"}
MANY = {"type": "array", "minItems": 5000, "items": {"type": "integer"}}


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Any) -> dict[str, Any]:
    tenant = {"models": ["sim-model"], "pools": ["default"], "max_output_tokens": 64}
    return {
        "tenancy": {"master_secret_file": stable_master_secret(tmp_path), "tenants": [
            {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], **tenant}]},
        "replicas": [{"id": "r0", "url": capture.urls[0], "pool": "default"}],
    }


def _hidden(where: str, target: dict[str, Any]) -> dict[str, Any]:
    """A required property ``SECRET`` whose schema is ``target``, reached by ``$ref`` into data or a name map
    (outlines-core: ``{"SECRET": (".{1,200}")}``; xgrammar: ``default_items{4999, -1}``)."""
    schema: dict[str, Any] = {"type": "object", "required": [SECRET, "b"], "properties": {
        "b": {"type": "string", "pattern": "^[a-z]{1,8}$"}}}
    if where == "default":
        schema["properties"][SECRET] = {"$ref": "#/default"}
        schema["default"] = target
    elif where == "const-of-a-def":
        schema["properties"][SECRET] = {"$ref": "#/$defs/holder/const"}
        schema["$defs"] = {"holder": {"const": target}}
    else:  # the $defs map itself as a schema: its property named "default" was read as data
        schema["properties"][SECRET] = {"$ref": "#/$defs"}
        schema["$defs"] = {"type": "object", "required": ["default"], "properties": {"default": target}}
    return schema


WHERE = ["default", "const-of-a-def", "defs-map"]


@pytest.mark.parametrize("where", WHERE)
async def test_a_quote_reading_pattern_behind_a_reference_into_data_is_refused(
        stack: Any, capture: Any, audit_log: ListLog, where: str) -> None:  # noqa: F811
    r = await stack.client.post(PATH, json=_chat(**_rf(_hidden(where, DOT))), headers=stack.auth())
    assert r.status_code == 400, r.text  # before: 200, forwarded
    err = r.json()["error"]
    assert err["code"] == "json_schema_too_complex"
    assert err["param"].startswith(f"{S}.properties.{SECRET}.$ref.") and err["param"].endswith(".pattern")
    assert "limits.json_schema.quote_reading_patterns" in err["message"]
    assert capture.seen == []
    event = _event(audit_log)
    assert (event.status_code, event.error_code, event.outcome.value) == (400, "json_schema_too_complex", "rejected")
    assert event.policy.reason == "response_format over limits.json_schema.quote_reading_patterns"
    assert SECRET not in json.dumps(event.to_dict())


@pytest.mark.parametrize("where", WHERE)
async def test_an_item_count_behind_a_reference_into_data_is_refused(stack: Any, capture: Any, where: str) -> None:
    r = await stack.client.post(PATH, json=_chat(**_rf(_hidden(where, MANY))), headers=stack.auth())
    assert r.status_code == 400, r.text  # before: 200, forwarded
    err = r.json()["error"]
    assert err["code"] == "json_schema_too_complex" and err["param"].endswith(".minItems")
    assert "limits.json_schema.max_item_count" in err["message"]
    assert capture.seen == []


async def test_the_same_in_a_tool_is_refused(stack: Any, capture: Any) -> None:
    r = await stack.client.post(PATH, json=_chat(**_tools(_hidden("default", DOT))), headers=stack.auth())
    assert r.status_code == 400, r.text  # before: 200, forwarded
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("json_schema_too_complex",
                                           f"tools.0.function.parameters.properties.{SECRET}.$ref.pattern")
    assert capture.seen == []


async def test_ordinary_references_and_data_are_forwarded(stack: Any, capture: Any) -> None:
    schemas = [
        {"type": "object", "required": ["a"], "properties": {"a": {"$ref": "#/$defs/word"}},
         "$defs": {"word": {"type": "string", "pattern": "^[a-z]{1,8}$"}}},
        {"type": "object", "properties": {"a": {"$ref": "#"}}},  # recursion to the root
        # data that looks like a schema but no reference reaches it: stays data
        {"type": "object", "properties": {"a": {"type": "object"}}, "default": {"a": DOT}, "examples": [MANY]},
    ]
    for schema in schemas:
        r = await stack.client.post(PATH, json=_chat(**_rf(schema)), headers=stack.auth())
        assert r.status_code == 200, r.text
    assert [seen.body["response_format"]["json_schema"]["schema"] for seen in capture.seen] == schemas


async def test_min_contains_is_bounded_like_min_items(stack: Any, capture: Any) -> None:
    """S29-final29-3: xgrammar writes ``{"items": int, "contains": int, "minContains": 5000}`` as
    ``basic_integer root_items{4999, -1}``, the same rule as ``minItems`` 5000."""
    for key in ("minContains", "maxContains"):
        schema = {"type": "object", "required": [SECRET], "properties": {SECRET: {
            "type": "array", "items": {"type": "integer"}, "contains": {"type": "integer"}, key: 5000}}}
        r = await stack.client.post(PATH, json=_chat(**_rf(schema)), headers=stack.auth())
        assert r.status_code == 400, r.text  # before: 200, forwarded
        err = r.json()["error"]
        assert (err["code"], err["param"]) == ("json_schema_too_complex", f"{S}.properties.{SECRET}.{key}")
        assert "limits.json_schema.max_item_count" in err["message"]
    ordinary = {"type": "array", "items": {"type": "integer"}, "contains": {"const": 1}, "minContains": 2}
    r = await stack.client.post(PATH, json=_chat(**_rf(ordinary)), headers=stack.auth())
    assert r.status_code == 200, r.text
    assert [seen.body["response_format"]["json_schema"]["schema"] for seen in capture.seen] == [ordinary]


async def test_each_tool_resolves_its_own_references(stack: Any, capture: Any) -> None:
    """The same reference text in two tools reaches a harmless ``default`` in the first and a quote-reading one in
    the second: each is resolved inside its own tool's schema."""
    harmless = {"type": "object", "required": ["a"], "properties": {"a": {"$ref": "#/default"}},
                "default": {"type": "string", "pattern": "^[a-z]{1,8}$"}}
    body = _chat(tools=[{"type": "function", "function": {"name": "f", "parameters": harmless}},
                        {"type": "function", "function": {"name": "g", "parameters": _hidden("default", DOT)}}])
    r = await stack.client.post(PATH, json=body, headers=stack.auth())
    assert r.status_code == 400, r.text  # before: 200, forwarded
    assert r.json()["error"]["param"] == f"tools.1.function.parameters.properties.{SECRET}.$ref.pattern"
    assert capture.seen == []
    r = await stack.client.post(PATH, json=_chat(tools=body["tools"][:1]), headers=stack.auth())
    assert r.status_code == 200, r.text


async def test_a_structural_tag_schema_resolves_its_references_inside_itself(stack: Any, capture: Any) -> None:
    """S29-final29-6: xgrammar compiles each ``structures[].schema`` of a ``structural_tag`` as a schema of its own,
    so ``#/default`` there is that schema's ``default`` (``default_items{4999, -1}``), not the response_format's."""
    def tag(schema: dict[str, Any]) -> dict[str, Any]:
        return {"response_format": {"type": "structural_tag", "triggers": ["<f"], "structures": [
            {"begin": "<f>", "schema": schema, "end": "</f>"}]}}

    r = await stack.client.post(PATH, json=_chat(**tag(_hidden("default", MANY))), headers=stack.auth())
    assert r.status_code == 400, r.text  # before: 200, forwarded
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (
        "json_schema_too_complex", f"response_format.structures.0.schema.properties.{SECRET}.$ref.minItems")
    assert capture.seen == []
    ordinary = tag({"type": "object", "properties": {"a": {"$ref": "#/$defs/a"}},
                    "$defs": {"a": {"type": "array", "maxItems": 8}}})
    r = await stack.client.post(PATH, json=_chat(**ordinary), headers=stack.auth())
    assert r.status_code == 200, r.text
