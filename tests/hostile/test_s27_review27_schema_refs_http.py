"""Session 27 review (review27): the ``$ref`` refusals of sessions 26 and 27 over HTTP, each with its audit event.

Session 26 tested them at function level only (tests/gateway/test_s26_review26_schema_refs.py): S26-review26-1 (every
local reference form outlines-core resolves counts toward ``limits.json_schema.max_bytes``), S26-lead-1 (a
JSON-pointer array index of non-ASCII digits raised a ValueError out of the bound: a 500), and S27-review27-1 (a
reference cycle counts as unrolled). Here each goes through the gateway: 400 ``json_schema_too_complex`` naming the
schema's path, nothing forwarded, one audit event ``rejected`` with the bound as its reason (never the schema's
names); the small schemas with the same reference forms are forwarded whole.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import TD
from tests.hostile.conftest import stable_master_secret
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.schema_http import PATH, chat as _chat, request_event as _event, rf as _rf, tools as _tools

SECRET = "launch_code_1234"  # a definition name: client text, never in the audit event
S = "response_format.json_schema.schema"


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Any) -> dict[str, Any]:
    return {
        "tenancy": {"master_secret_file": stable_master_secret(tmp_path), "tenants": [
            {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"],
             "pools": ["default"], "max_output_tokens": 64}]},
        "replicas": [{"id": "r0", "url": capture.urls[0], "pool": "default"},
                     {"id": "r1", "url": capture.urls[1], "pool": "default"}],
        "limits": {"max_body_bytes": 1 << 20},
    }


def _doubling_defs(n: int, form: str) -> dict[str, Any]:
    defs: dict[str, Any] = {f"{SECRET}{i}": {"anyOf": [{"$ref": form.format(i=i + 1)}] * 2} for i in range(n)}
    defs[f"{SECRET}{n}"] = {"type": "string"}
    return {"$defs": defs, "$ref": form.format(i=0)}


def _doubling_properties(n: int) -> dict[str, Any]:
    props: dict[str, Any] = {f"{SECRET}{i}": {"anyOf": [{"$ref": f"#/properties/{SECRET}{i + 1}"}] * 2}
                             for i in range(n)}
    props[f"{SECRET}{n}"] = {"type": "string"}
    return {"type": "object", "properties": props}


def _non_ascii_index(part: str) -> dict[str, Any]:  # S26-lead-1: the rest of the schema still counted
    schema = _doubling_properties(20)
    schema["allOf"] = [{"$ref": f"#/allOf/{part}"}]
    return schema


BYPASSES = {  # S26-review26-1's forms, S26-lead-1, S27-review27-1: each ~1-2 KB, each far over 64 KiB inlined
    "properties": _doubling_properties(20),
    "no-hash": _doubling_defs(20, "$defs/" + SECRET + "{i}"),
    "hash-no-slash": _doubling_defs(20, "#$defs/" + SECRET + "{i}"),
    "empty-parts": _doubling_defs(20, "#//$defs/" + SECRET + "{i}"),
    "percent": _doubling_defs(20, "#/%24defs/" + SECRET + "{i}"),
    "own-id": {"$id": "urn:x", **_doubling_defs(20, "urn:x#/$defs/" + SECRET + "{i}")},
    "non-ascii-index-superscript": _non_ascii_index("²"),
    "non-ascii-index-arabic": _non_ascii_index("١"),
    "cycle-fan-out": {"type": "object", "properties": {f"{SECRET}{i}": {"$ref": "#"} for i in range(8)}},
}


@pytest.mark.parametrize("name", list(BYPASSES))
async def test_a_reference_bypass_in_response_format_is_refused_and_audited(
        stack: Any, capture: Any, audit_log: ListLog, name: str) -> None:  # noqa: F811
    schema = BYPASSES[name]
    assert len(json.dumps(schema)) < 4096
    r = await stack.client.post(PATH, json=_chat(**_rf(schema)), headers=stack.auth())
    assert r.status_code == 400, r.text  # before session 26: 200 (and 500 for the non-ASCII index), forwarded
    err = r.json()["error"]
    assert (err["code"], err["type"], err["param"]) == ("json_schema_too_complex", "invalid_request_error", S)
    assert "limits.json_schema.max_bytes" in err["message"] and "$ref are inlined" in err["message"]
    assert capture.seen == []
    event = _event(audit_log)
    assert (event.status_code, event.error_code, event.outcome.value) == (400, "json_schema_too_complex", "rejected")
    assert event.policy.reason == "response_format over limits.json_schema.max_bytes"
    assert SECRET not in json.dumps(event.to_dict())


@pytest.mark.parametrize("name", list(BYPASSES))
async def test_a_reference_bypass_in_tools_is_refused_and_audited(
        stack: Any, capture: Any, audit_log: ListLog, name: str) -> None:  # noqa: F811
    r = await stack.client.post(PATH, json=_chat(**_tools(BYPASSES[name])), headers=stack.auth())
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("json_schema_too_complex", "tools.0.function.parameters")
    assert "limits.json_schema.max_bytes" in err["message"]
    assert capture.seen == []
    event = _event(audit_log)
    assert (event.status_code, event.error_code, event.outcome.value) == (400, "json_schema_too_complex", "rejected")
    assert event.policy.reason == "tools parameters over limits.json_schema.max_bytes"
    assert SECRET not in json.dumps(event.to_dict())


SMALL = {  # the same reference forms in schemas that stay small once inlined: forwarded whole
    "non-ascii-index": {"type": "object", "properties": {"a": {"$ref": "#/allOf/²"}},
                        "allOf": [{}, {"type": "string"}]},
    "percent": {"$defs": {"a b": {"type": "string"}}, "type": "object", "properties": {"x": {"$ref": "#/$defs/a%20b"}}},
    "escapes": {"$defs": {"a/b~": {"type": "string"}}, "type": "object",
                "properties": {"x": {"$ref": "#/$defs/a~1b~0"}}},
    "linked-list": {"type": "object", "properties": {"value": {"type": "integer"}, "next": {"$ref": "#"}}},
}


@pytest.mark.parametrize("name", list(SMALL))
async def test_small_schemas_with_the_same_reference_forms_are_forwarded(
        stack: Any, capture: Any, audit_log: ListLog, name: str) -> None:  # noqa: F811
    schema = SMALL[name]
    r = await stack.client.post(PATH, json=_chat(**_rf(schema)), headers=stack.auth())
    assert r.status_code == 200, r.text  # S26-lead-1: the non-ASCII index was a 500 before session 26
    [seen] = capture.seen
    assert seen.body["response_format"]["json_schema"]["schema"] == schema
    assert _event(audit_log).outcome.value == "allowed"
