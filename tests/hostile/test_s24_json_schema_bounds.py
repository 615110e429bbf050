"""Session 24 (S23-fields-2): a chat body's ``response_format`` schema, which the replica compiles into a grammar
before the first token (xgrammar / outlines in vLLM and SGLang, unbounded there), is bounded by the gateway:
``limits.json_schema`` (bytes, schema levels, properties, enum values, pattern characters), overridden per tenant by
``tenants[].json_schema_limits``. A body over a bound answers 400 ``json_schema_too_complex`` naming the client's
path; nothing reaches a replica; the audit event records the refusal and the bound, never the schema's names.

Before: every refused body below answered 200 and the replica received the schema whole.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import TD
from tests.hostile.conftest import stable_master_secret
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

PATH = "/v1/chat/completions"
SECRET = "launch_code_1234"  # a property name: client text, never in the audit event


def _tenant(tid: str, **kw: Any) -> dict[str, Any]:
    return {"id": tid, "spiffe_ids": [f"spiffe://{TD}/{tid}/"], "models": ["sim-model"], "pools": ["default"],
            "max_output_tokens": 64, **kw}


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Any) -> dict[str, Any]:
    return {
        "tenancy": {"master_secret_file": stable_master_secret(tmp_path), "tenants": [
            _tenant("tenant-a"),
            _tenant("tenant-wide", json_schema_limits={"max_pattern_chars": 8192, "max_enum_values": 5000}),
            _tenant("tenant-narrow", json_schema_limits={"max_depth": 2, "max_properties": 10}),
        ]},
        "replicas": [{"id": "r0", "url": capture.urls[0], "pool": "default"},
                     {"id": "r1", "url": capture.urls[1], "pool": "default"}],
        "limits": {"max_body_bytes": 1 << 20},
    }


def _chat(schema: Any) -> dict[str, Any]:
    return {"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hello there"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}}


def _nested(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "object", "properties": {"k": schema}}
    return schema


S = "response_format.json_schema.schema"
CASES = [  # (schema, param, bound)
    ({"type": "object", "properties": {SECRET: {"type": "string", "pattern": "(a+)+" * 300}}},
     f"{S}.properties.{SECRET}.pattern", "max_pattern_chars"),
    ({"type": "object", "patternProperties": {"^x" * 600: {"type": "string"}}}, None, "max_pattern_chars"),
    (_nested(21), S + ".properties.k" * 20, "max_depth"),
    ({"type": "array", "items": {"enum": list(range(1001))}}, f"{S}.items.enum", "max_enum_values"),
    ({"type": "object", "description": "d" * 70_000}, "response_format", "max_bytes"),
    ({"anyOf": [{"oneOf": [_nested(20)]}]}, None, "max_depth"),
]


@pytest.mark.parametrize("schema, param, bound", CASES)
async def test_a_schema_over_a_bound_is_refused(stack: Any, capture: Any, audit_log: ListLog,  # noqa: F811
                                                schema: Any, param: str | None, bound: str) -> None:
    r = await stack.client.post(PATH, json=_chat(schema), headers=stack.auth())
    assert r.status_code == 400, r.text  # before: 200, the schema forwarded whole
    err = r.json()["error"]
    assert (err["code"], err["type"]) == ("json_schema_too_complex", "invalid_request_error")
    assert f"limits.json_schema.{bound}" in err["message"]
    if param is not None:
        assert err["param"] == param
    assert err["param"].startswith("response_format")
    assert capture.seen == []  # nothing reached a replica
    [event] = [e for e in audit_log.events if getattr(e, "endpoint", None) == PATH]
    assert (event.status_code, event.error_code) == (400, "json_schema_too_complex")
    assert event.policy.reason == f"response_format over limits.json_schema.{bound}"
    assert SECRET not in json.dumps(event.to_dict())  # the bound, never the schema's names


async def test_an_ordinary_schema_is_forwarded_whole(stack: Any, capture: Any) -> None:
    schema = {"type": "object", "additionalProperties": False, "required": ["city", "unit"], "properties": {
        "city": {"type": "string", "pattern": "^[A-Z][a-z]+$"}, "unit": {"enum": ["C", "F"]},
        "days": {"type": "array", "items": {"type": "object", "properties": {"t": {"type": "number"}}}}}}
    r = await stack.client.post(PATH, json=_chat(schema), headers=stack.auth())
    assert r.status_code == 200, r.text
    [seen] = capture.seen
    assert seen.body["response_format"]["json_schema"]["schema"] == schema
    r = await stack.client.post(PATH, json={**_chat(None), "response_format": {"type": "json_object"}},
                                headers=stack.auth())
    assert r.status_code == 200, r.text


async def test_bounds_are_per_tenant(stack: Any, capture: Any) -> None:
    long_pattern = {"type": "string", "pattern": "a" * 4000}
    wide = stack.auth("tenant-wide/app")
    assert (await stack.client.post(PATH, json=_chat(long_pattern), headers=wide)).status_code == 200
    assert (await stack.client.post(PATH, json=_chat({"enum": list(range(3000))}), headers=wide)).status_code == 200
    r = await stack.client.post(PATH, json=_chat(long_pattern), headers=stack.auth())
    assert r.status_code == 400 and r.json()["error"]["code"] == "json_schema_too_complex"
    narrow = stack.auth("tenant-narrow/app")
    r = await stack.client.post(PATH, json=_chat(_nested(3)), headers=narrow)
    assert r.status_code == 400 and r.json()["error"]["param"] == f"{S}.properties.k.properties.k", r.text
    assert (await stack.client.post(PATH, json=_chat(_nested(3)), headers=stack.auth())).status_code == 200
    eleven = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(11)}}
    r = await stack.client.post(PATH, json=_chat(eleven), headers=narrow)
    assert r.status_code == 400 and r.json()["error"]["param"] == f"{S}.properties", r.text
    assert "limits.json_schema.max_properties" in r.json()["error"]["message"]
    assert (await stack.client.post(PATH, json=_chat(eleven), headers=stack.auth())).status_code == 200
