"""Session 29 (xgrammar29, S29-xgrammar29-1): a counted repetition of array items or object properties
(``minItems`` / ``maxItems`` / ``minProperties`` / ``maxProperties``) makes xgrammar 0.2.9's matcher (vLLM's and
SGLang's default structured-output backend) hold more parser states per item: with a lower bound of 130 or more,
each ``accept_token`` costs time and memory that grow with the bound (``minItems`` 130 over 4,096 integer items:
88 MB and a 29 ms accept; ``minItems`` 16,384: ``std::bad_alloc`` past 4 GiB; ``maxItems`` 100,000 the same), on the
engine's step that every tenant's sequences share (bench/s29_xgrammar29_mask_fill.py). Over HTTP: such a
``response_format`` or a tool's ``parameters`` answers 400 ``json_schema_too_complex`` naming
``limits.json_schema.max_item_count`` (default 128), ``param`` the client's path to the keyword, nothing forwarded,
one audit event ``rejected`` without the schema's text; ordinary counts (and a tenant's own higher value or null)
are forwarded. Before the fix every one of these was forwarded (200).
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
    tenant = {"spiffe_ids": [], "models": ["sim-model"], "pools": ["default"], "max_output_tokens": 64}
    return {
        "tenancy": {"master_secret_file": stable_master_secret(tmp_path), "tenants": [
            {**tenant, "id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"]},
            {**tenant, "id": "tenant-b", "spiffe_ids": [f"spiffe://{TD}/tenant-b/"],
             "json_schema_limits": {"max_item_count": None}},
            {**tenant, "id": "tenant-c", "spiffe_ids": [f"spiffe://{TD}/tenant-c/"],
             "json_schema_limits": {"max_item_count": 4096}}]},
        "replicas": [{"id": "r0", "url": capture.urls[0], "pool": "default"}],
    }


_INTS = {"type": "array", "items": {"type": "integer"}, "description": SECRET}
_OBJ = {"type": "object", "additionalProperties": {"type": "integer"}, "description": SECRET}
COUNTED = {  # (schema, the keyword's path below the schema): each under every other bound
    "root-minItems": ({**_INTS, "minItems": 130}, "minItems"),
    "root-maxItems": ({**_INTS, "maxItems": 100000}, "maxItems"),
    "float-minItems": ({**_INTS, "minItems": 1e6}, "minItems"),
    "minProperties": ({**_OBJ, "minProperties": 1000}, "minProperties"),
    "maxProperties": ({**_OBJ, "maxProperties": 100000}, "maxProperties"),
    "property": ({"type": "object", "required": [SECRET], "properties": {SECRET: {**_INTS, "minItems": 16384}}},
                 f"properties.{SECRET}.minItems"),
    "array-item": ({"type": "array", "items": {**_INTS, "minItems": 4096}}, "items.minItems"),
    "def": ({"$ref": "#/$defs/a", "$defs": {"a": {**_INTS, "minItems": 100, "maxItems": 5000}}}, "$defs.a.maxItems"),
}

ORDINARY = {  # well within the bound, or the keyword's name as data: forwarded
    "minItems-1-maxItems-10": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 10},
    "maxItems-128": {"type": "array", "items": {"type": "integer"}, "maxItems": 128},
    "minProperties-2": {"type": "object", "additionalProperties": {"type": "integer"}, "minProperties": 2},
    "a-property-named-minItems": {"type": "object", "properties": {"minItems": {"type": "integer"}}},
    "enum-value": {"enum": [{"minItems": 100000}]},
}


@pytest.mark.parametrize("name", list(COUNTED))
async def test_a_large_item_count_is_refused_and_audited(
        stack: Any, capture: Any, audit_log: ListLog, name: str) -> None:  # noqa: F811
    schema, where = COUNTED[name]
    r = await stack.client.post(PATH, json=_chat(**_rf(schema)), headers=stack.auth())
    assert r.status_code == 400, r.text  # before: 200, forwarded
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("json_schema_too_complex", f"{S}.{where}")
    assert "limits.json_schema.max_item_count" in err["message"]
    assert capture.seen == []
    event = _event(audit_log)
    assert (event.status_code, event.error_code, event.outcome.value) == (400, "json_schema_too_complex", "rejected")
    assert event.policy.reason == "response_format over limits.json_schema.max_item_count"
    assert SECRET not in json.dumps(event.to_dict())


async def test_a_large_item_count_in_a_tool_is_refused(stack: Any, capture: Any) -> None:
    r = await stack.client.post(PATH, json=_chat(**_tools(COUNTED["property"][0])), headers=stack.auth())
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("json_schema_too_complex",
                                           f"tools.0.function.parameters.properties.{SECRET}.minItems")
    assert "limits.json_schema.max_item_count" in err["message"]
    assert capture.seen == []


async def test_ordinary_counts_are_forwarded(stack: Any, capture: Any) -> None:
    for schema in ORDINARY.values():
        r = await stack.client.post(PATH, json=_chat(**_rf(schema)), headers=stack.auth())
        assert r.status_code == 200, r.text
    assert [seen.body["response_format"]["json_schema"]["schema"] for seen in capture.seen] == list(ORDINARY.values())


async def test_a_tenants_own_value_or_null_stands(stack: Any, capture: Any) -> None:
    r = await stack.client.post(PATH, json=_chat(**_rf(COUNTED["root-maxItems"][0])),
                                headers=stack.auth("tenant-b/app"))  # null: not checked
    assert r.status_code == 200, r.text
    r = await stack.client.post(PATH, json=_chat(**_rf(COUNTED["array-item"][0])),
                                headers=stack.auth("tenant-c/app"))  # 4096 <= its own 4096
    assert r.status_code == 200, r.text
    r = await stack.client.post(PATH, json=_chat(**_rf(COUNTED["root-maxItems"][0])),
                                headers=stack.auth("tenant-c/app"))  # 100000 > 4096
    assert r.status_code == 400 and r.json()["error"]["param"] == f"{S}.maxItems"
    assert len(capture.seen) == 2
