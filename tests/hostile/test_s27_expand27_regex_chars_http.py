"""Session 27 (expand27, S27-review27-3): ``limits.json_schema.max_regex_chars`` over HTTP. A schema within every byte,
depth and count bound that outlines-core expands to millions of characters (review27's three shapes, no ``$ref``)
answers 400 ``json_schema_too_complex`` naming its path and the bound, nothing is forwarded, one audit event
``rejected`` with the bound as its reason (never the schema's names); ordinary schemas are forwarded whole; a tenant's
``json_schema_limits.max_regex_chars`` (a number, or null: off) overrides the gateway's. Before: each shape was
forwarded (200).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import TD
from tests.hostile.conftest import stable_master_secret
from tests.hostile.test_s27_review27_schema_refs_http import PATH, _chat, _event, _rf, _tools
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.ordinary_schemas import ORDINARY

SECRET = "launch_code_1234"  # a property name: client text, never in the audit event
S = "response_format.json_schema.schema"


def _tenant(tid: str, **kw: Any) -> dict[str, Any]:
    return {"id": tid, "spiffe_ids": [f"spiffe://{TD}/{tid}/"], "models": ["sim-model"], "pools": ["default"],
            "max_output_tokens": 64, **kw}


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Any) -> dict[str, Any]:
    return {
        "tenancy": {"master_secret_file": stable_master_secret(tmp_path), "tenants": [
            _tenant("tenant-a"),
            _tenant("tenant-xgrammar", json_schema_limits={"max_regex_chars": None}),
            _tenant("tenant-narrow", json_schema_limits={"max_regex_chars": 20_000})]},
        "replicas": [{"id": "r0", "url": capture.urls[0], "pool": "default"},
                     {"id": "r1", "url": capture.urls[1], "pool": "default"}],
        # session 29 (pattern29, S29-pattern29-1): quote_reading_patterns off here (this file bounds max_regex_chars);
        # create_contact's ``format: uri`` kills outlines-core and is refused by it at the default
        "limits": {"max_body_bytes": 1 << 20, "json_schema": {"quote_reading_patterns": "allow"}},
    }


def _optional(n: int) -> dict[str, Any]:
    return {"type": "object", "properties": {f"{SECRET}{i}": {"type": "integer"} for i in range(n)}}


def _nested_optional(levels: int, k: int) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        s = {"type": "object", "properties": {SECRET: s, **{f"p{i}": {"type": "integer"} for i in range(k - 1)}}}
    return s


def _arrays(levels: int) -> dict[str, Any]:
    s: dict[str, Any] = {"type": "integer", "description": SECRET}
    for _ in range(levels):
        s = {"type": "array", "items": s}
    return s


SHAPES = {  # review27's: 3.6 M, 2.4 M, 3.2 M characters in outlines-core 0.2.14; and a bare object 6 levels deep
    "400-optional": _optional(400),
    "nested-optional": _nested_optional(6, 5),
    "nested-arrays": _arrays(16),
    "object-depth": {"type": "object", "depth": 6, "description": SECRET},
}


@pytest.mark.parametrize("name", list(SHAPES))
async def test_an_expanding_response_format_is_refused_and_audited(
        stack: Any, capture: Any, audit_log: ListLog, name: str) -> None:  # noqa: F811
    r = await stack.client.post(PATH, json=_chat(**_rf(SHAPES[name])), headers=stack.auth())
    assert r.status_code == 400, r.text  # before: 200, forwarded
    err = r.json()["error"]
    assert (err["code"], err["type"], err["param"]) == ("json_schema_too_complex", "invalid_request_error", S)
    assert "limits.json_schema.max_regex_chars" in err["message"]
    assert capture.seen == []
    event = _event(audit_log)
    assert (event.status_code, event.error_code, event.outcome.value) == (400, "json_schema_too_complex", "rejected")
    assert event.policy.reason == "response_format over limits.json_schema.max_regex_chars"
    assert SECRET not in json.dumps(event.to_dict())


@pytest.mark.parametrize("name", list(SHAPES))
async def test_an_expanding_tool_is_refused_and_audited(
        stack: Any, capture: Any, audit_log: ListLog, name: str) -> None:  # noqa: F811
    r = await stack.client.post(PATH, json=_chat(**_tools(SHAPES[name])), headers=stack.auth())
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("json_schema_too_complex", "tools.0.function.parameters")
    assert "limits.json_schema.max_regex_chars" in err["message"]
    assert capture.seen == []
    event = _event(audit_log)
    assert (event.status_code, event.error_code, event.outcome.value) == (400, "json_schema_too_complex", "rejected")
    assert event.policy.reason == "tools parameters over limits.json_schema.max_regex_chars"
    assert SECRET not in json.dumps(event.to_dict())


async def test_ordinary_schemas_are_forwarded_whole(stack: Any, capture: Any) -> None:
    tools = [{"type": "function", "function": {"name": k.split()[0], "parameters": v}} for k, v in ORDINARY.items()]
    r = await stack.client.post(PATH, json=_chat(tools=tools, tool_choice="required"), headers=stack.auth())
    assert r.status_code == 200, r.text
    for schema in ORDINARY.values():
        r = await stack.client.post(PATH, json=_chat(**_rf(schema)), headers=stack.auth())
        assert r.status_code == 200, r.text
    assert [seen.body.get("tools") or seen.body["response_format"]["json_schema"]["schema"]
            for seen in capture.seen] == [tools, *ORDINARY.values()]


async def test_the_bound_is_per_tenant(stack: Any, capture: Any, audit_log: ListLog) -> None:  # noqa: F811
    off = stack.auth("tenant-xgrammar/app")  # null: its replicas do not expand; not checked
    r = await stack.client.post(PATH, json=_chat(**_rf(SHAPES["400-optional"])), headers=off)
    assert r.status_code == 200, r.text
    narrow = stack.auth("tenant-narrow/app")
    contact = ORDINARY["create_contact (15 optional)"]  # about 43,000 characters counted
    r = await stack.client.post(PATH, json=_chat(**_rf(contact)), headers=narrow)
    assert r.status_code == 400 and "more than 20000 characters" in r.json()["error"]["message"], r.text
    r = await stack.client.post(PATH, json=_chat(**_rf(contact)), headers=stack.auth())
    assert r.status_code == 200, r.text
    assert len(capture.seen) == 2


async def test_many_tools_are_summed_only_for_tool_choice_required(stack: Any, capture: Any,
                                                                  audit_log: ListLog) -> None:  # noqa: F811
    """Session 27 (lead): vLLM builds one schema of every tool for ``tool_choice: "required"`` only. The nine
    ordinary tools under 20,000 characters each sum to ~52,000 as ``required``: over tenant-narrow's bound
    (20,000) then, but forwarded under ``auto`` or without ``tool_choice`` (each tool is still checked alone)."""
    tools = [{"type": "function", "function": {"name": k.split()[0], "parameters": v}} for k, v in ORDINARY.items()
             if k.split()[0] in ("get_weather", "math_reasoning", "search_flights", "register_user", "order", "tree",
                                 "extract_entities", "run_sql", "create_event")]
    narrow = stack.auth("tenant-narrow/app")
    for extra in ({"tool_choice": "auto"}, {}):
        r = await stack.client.post(PATH, json=_chat(tools=tools, **extra), headers=narrow)
        assert r.status_code == 200, r.text
    r = await stack.client.post(PATH, json=_chat(tools=tools, tool_choice="required"), headers=narrow)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert "together" in r.json()["error"]["message"]
    assert len(capture.seen) == 2


async def test_attack27_shapes_are_refused_and_audited_over_http(stack: Any, capture: Any,
                                                                 audit_log: ListLog) -> None:  # noqa: F811
    """S27-attack27-1 (``#/$defs/``: outlines-core builds the map itself, 28.6 M characters from 74 bytes) in a
    ``response_format``, and S27-attack27-2 (``required``: one tool's references into another's ``$defs``) as
    tools: 400 ``json_schema_too_complex``, nothing forwarded, one audit event ``rejected`` with the bound. Before:
    both forwarded (200)."""
    empty = {"$defs": {"": {"type": "null"}, "type": "object", "depth": 8}, "$ref": "#/$defs/"}
    r = await stack.client.post(PATH, json=_chat(**_rf(empty)), headers=stack.auth())
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("json_schema_too_complex", S)
    event = _event(audit_log)
    assert (event.status_code, event.outcome.value) == (400, "rejected")
    assert event.policy.reason == "response_format over limits.json_schema.max_regex_chars"
    a = {"type": "function", "function": {"name": "a", "parameters": {
        "type": "object", "properties": {f"{SECRET}{i}": {"$ref": "#/$defs/big"} for i in range(4)}}}}
    b = {"type": "function", "function": {"name": "b", "parameters": {
        "type": "object", "properties": {}, "$defs": {"big": {"type": "object", "depth": 6}}}}}
    r = await stack.client.post(PATH, json=_chat(tools=[a, b], tool_choice="required"), headers=stack.auth())
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert capture.seen == []
    events = [e for e in audit_log.events if e.status_code == 400]
    assert len(events) == 2 and events[-1].policy.reason == "tools parameters over limits.json_schema.max_regex_chars"
    assert SECRET not in json.dumps(events[-1].to_dict())
