"""Session 28 (attack28, S28-attack28-1): a string with a counted repetition at the start of the expression
outlines-core builds (the whole schema ``{"type": "string", "maxLength": 24}``, 32 bytes, or reached from the root
through ``anyOf`` / ``$ref`` / a list of types, or a ``pattern`` such as ``.{20}``) costs outlines-core's ``Index``
twice the CPU and memory per unit of the bound (``maxLength`` 16: 4.3 s and 261 MB; 24: more than 3 GB) while its
expression stays under 50 characters. Over HTTP: such a ``response_format`` or a tool's ``parameters`` answers 400
``json_schema_too_complex`` (``limits.json_schema.max_regex_chars``), nothing forwarded, one audit event
``rejected`` without the schema's text; the same string as a property or an array item, and ``maxLength`` 16 at the
root, are forwarded. Before the fix every one of these was forwarded (200).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import TD
from tests.hostile.conftest import stable_master_secret
from tests.hostile.test_s27_review27_schema_refs_http import PATH, _chat, _event, _rf, _tools
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

SECRET = "launch_code_1234"  # client text: never in the audit event
S = "response_format.json_schema.schema"


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Any) -> dict[str, Any]:
    return {
        "tenancy": {"master_secret_file": stable_master_secret(tmp_path), "tenants": [
            {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"],
             "pools": ["default"], "max_output_tokens": 64}]},
        "replicas": [{"id": "r0", "url": capture.urls[0], "pool": "default"}],
    }


LEADING = {  # all under every byte, depth and count bound; outlines-core's Index: seconds to out of memory
    "root-maxLength": {"type": "string", "maxLength": 24, "description": SECRET},
    "root-minLength": {"type": "string", "minLength": 20, "description": SECRET},
    "anyOf-null": {"anyOf": [{"type": "string", "maxLength": 24, "description": SECRET}, {"type": "null"}]},
    "type-list": {"type": ["string", "null"], "maxLength": 24, "description": SECRET},
    "ref": {"$ref": "#/$defs/s", "$defs": {"s": {"type": "string", "maxLength": 24, "description": SECRET}}},
    "pattern": {"type": "string", "pattern": ".{20}", "description": SECRET},
}

CHEAP = {  # milliseconds in outlines-core: forwarded
    "property": {"type": "object", "required": [SECRET], "properties": {SECRET: {"type": "string", "maxLength": 200}}},
    "array-item": {"type": "array", "items": {"type": "string", "maxLength": 200}},
    "root-maxLength-16": {"type": "string", "maxLength": 16},
    "root-unbounded": {"type": "string"},
}


@pytest.mark.parametrize("name", list(LEADING))
async def test_a_leading_counted_string_is_refused_and_audited(
        stack: Any, capture: Any, audit_log: ListLog, name: str) -> None:  # noqa: F811
    r = await stack.client.post(PATH, json=_chat(**_rf(LEADING[name])), headers=stack.auth())
    assert r.status_code == 400, r.text  # before: 200, forwarded
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("json_schema_too_complex", S)
    assert "limits.json_schema.max_regex_chars" in err["message"]
    assert capture.seen == []
    event = _event(audit_log)
    assert (event.status_code, event.error_code, event.outcome.value) == (400, "json_schema_too_complex", "rejected")
    assert event.policy.reason == "response_format over limits.json_schema.max_regex_chars"
    assert SECRET not in json.dumps(event.to_dict())


async def test_a_leading_counted_string_as_a_named_tool_is_refused(
        stack: Any, capture: Any, audit_log: ListLog) -> None:  # noqa: F811
    """A named ``tool_choice`` compiles the tool's ``parameters`` alone: the string is the whole schema."""
    body = _chat(**_tools(LEADING["root-maxLength"]))
    body["tool_choice"] = {"type": "function", "function": {"name": body["tools"][0]["function"]["name"]}}
    r = await stack.client.post(PATH, json=body, headers=stack.auth())
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["code"], r.json()["error"]["param"]) == ("json_schema_too_complex",
                                                                       "tools.0.function.parameters")
    assert capture.seen == []


async def test_a_counted_string_elsewhere_is_forwarded(stack: Any, capture: Any) -> None:
    for schema in CHEAP.values():
        r = await stack.client.post(PATH, json=_chat(**_rf(schema)), headers=stack.auth())
        assert r.status_code == 200, r.text
    assert [seen.body["response_format"]["json_schema"]["schema"] for seen in capture.seen] == list(CHEAP.values())
