"""Session 31 (tools31, S30-attack30-4) over HTTP: a ``response_format`` whose property refers to a ``$anchor`` /
``$id`` name of a schema hidden in ``default`` (a pattern far over ``limits.json_schema.max_pattern_states``) was
forwarded (200): the walk resolved JSON pointers only. Now 400 ``json_schema_too_complex`` naming the bound and the
reference's path, nothing forwarded, one audit event ``rejected`` without schema text; an ordinary schema using
``$anchor`` / ``$id`` references is forwarded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import TD
from tests.hostile.conftest import stable_master_secret
from tests.hostile.test_s27_review27_schema_refs_http import PATH, _chat, _event, _rf
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

SECRET = "QQQ_hidden"  # client text (an anchor name): never in the audit event
HOSTILE = "[ab]*a" + "[ab]" * 20
S = "response_format.json_schema.schema"


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Any) -> dict[str, Any]:
    return {
        "limits": {"max_body_bytes": 1 << 20},
        "tenancy": {"master_secret_file": stable_master_secret(tmp_path), "tenants": [
            {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"],
             "pools": ["default"], "max_output_tokens": 64}]},
        "replicas": [{"id": "r0", "url": capture.urls[0], "pool": "default"}],
    }


FORMS = {"$anchor": (f"#{SECRET}", {"$anchor": SECRET}), "$id": (f"urn:{SECRET}", {"$id": f"urn:{SECRET}"})}


@pytest.mark.parametrize("form", list(FORMS))
async def test_a_schema_hidden_under_a_name_is_refused_and_audited(
        stack: Any, capture: Any, audit_log: ListLog, form: str) -> None:  # noqa: F811
    ref, name = FORMS[form]
    schema = {"type": "object", "properties": {"a": {"$ref": ref}},
              "default": {"x": {**name, "type": "string", "pattern": HOSTILE}}}
    r = await stack.client.post(PATH, json=_chat(**_rf(schema)), headers=stack.auth())
    assert r.status_code == 400, r.text  # before: 200, forwarded
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("json_schema_too_complex", f"{S}.properties.a.$ref.pattern")
    assert "limits.json_schema.max_pattern_states" in err["message"]
    assert capture.seen == []
    event = _event(audit_log)
    assert (event.status_code, event.error_code, event.outcome.value) == (400, "json_schema_too_complex", "rejected")
    assert event.policy.reason == "response_format over limits.json_schema.max_pattern_states"
    text = json.dumps(event.to_dict())
    assert SECRET not in text and HOSTILE not in text


async def test_an_ordinary_anchored_schema_is_forwarded(stack: Any, capture: Any) -> None:
    schema = {"$id": "urn:example:order", "type": "object", "$defs": {
        "money": {"$anchor": "money", "type": "string", "pattern": "^[0-9]{1,9}\\.[0-9]{2}$"}},
        "properties": {"total": {"$ref": "#money"}, "tax": {"$ref": "#/$defs/money"}}, "required": ["total"]}
    r = await stack.client.post(PATH, json=_chat(**_rf(schema)), headers=stack.auth())
    assert r.status_code == 200, r.text
    assert [seen.body["response_format"]["json_schema"]["schema"] for seen in capture.seen] == [schema]
