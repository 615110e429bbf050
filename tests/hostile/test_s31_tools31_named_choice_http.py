"""Session 31 (tools31, S31-review31-4) over HTTP: a named ``tool_choice`` of a tool whose ``parameters`` hold a
pattern counted just under ``limits.json_schema.max_pattern_states`` once (SGLang's outlines backend compiles the tool
in an array, which outlines-core writes twice: ~2x the bound), or whose regular expression is just under
``max_regex_chars`` alone, answered 200 and was forwarded. Now 400 ``json_schema_too_complex`` naming the bound,
nothing forwarded, one audit event ``rejected`` naming the bound and no schema text; the same tools under ``auto``
and ordinary named tools are forwarded.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import TD
from tests.hostile.conftest import stable_master_secret
from tests.hostile.test_s27_review27_schema_refs_http import PATH, _chat, _event
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.ordinary_patterns import ORDINARY

SECRET = "QQQ_launch_code"  # client text (a property name): never in the audit event
HOSTILE = "[ab]*a" + "[ab]" * 11  # 4,228 states counted once (cap 8,192 since session 31)
WIDE = {"type": "object", "required": [SECRET, "y"], "properties": {  # 557,978 chars alone, 1,116,195 named
    SECRET: {"type": "object", "depth": 5}, "y": {"type": "object", "depth": 4}}}


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Any) -> dict[str, Any]:
    tenant = {"models": ["sim-model"], "pools": ["default"], "max_output_tokens": 64}
    return {
        "limits": {"max_body_bytes": 1 << 20},
        "tenancy": {"master_secret_file": stable_master_secret(tmp_path), "tenants": [
            {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], **tenant}]},
        "replicas": [{"id": "r0", "url": capture.urls[0], "pool": "default"}],
    }


def _body(parameters: Any, choice: Any) -> dict[str, Any]:
    body = _chat(tools=[{"type": "function", "function": {"name": "plain", "parameters": {
        "type": "object", "properties": {"n": {"type": "integer"}}}}},
        {"type": "function", "function": {"name": "lookup", "parameters": parameters}}])
    if choice is not None:
        body["tool_choice"] = choice
    return body


NAMED = {"type": "function", "function": {"name": "lookup"}}
CASES = {
    "pattern states": ({"type": "object", "required": [SECRET], "properties": {
        SECRET: {"type": "string", "pattern": HOSTILE}}}, "max_pattern_states",
        f"tools.1.function.parameters.properties.{SECRET}.pattern"),
    "regex chars": (WIDE, "max_regex_chars", "tools.1.function.parameters"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_named_tool_compiled_twice_is_refused_and_audited(
        stack: Any, capture: Any, audit_log: ListLog, case: str) -> None:  # noqa: F811
    parameters, bound, param = CASES[case]
    r = await stack.client.post(PATH, json=_body(parameters, NAMED), headers=stack.auth())
    assert r.status_code == 400, r.text  # before: 200, forwarded
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("json_schema_too_complex", param)
    assert f"limits.json_schema.{bound}" in err["message"]
    assert capture.seen == []
    event = _event(audit_log)
    assert (event.status_code, event.error_code, event.outcome.value) == (400, "json_schema_too_complex", "rejected")
    assert event.policy.reason == f"tools parameters over limits.json_schema.{bound}"
    text = json.dumps(event.to_dict())
    assert SECRET not in text and HOSTILE not in text


@pytest.mark.parametrize("case", list(CASES))
async def test_the_same_tools_under_auto_or_another_name_are_forwarded(stack: Any, capture: Any, case: str) -> None:
    parameters = CASES[case][0]
    bodies = [_body(parameters, None), _body(parameters, "auto"),
              _body(parameters, {"type": "function", "function": {"name": "plain"}})]
    for body in bodies:
        r = await stack.client.post(PATH, json=body, headers=stack.auth())
        assert r.status_code == 200, r.text
    assert [seen.body["tools"] for seen in capture.seen] == [body["tools"] for body in bodies]


async def test_ordinary_named_tools_are_forwarded(stack: Any, capture: Any) -> None:
    """Each quote-free ordinary pattern of tests/support/ordinary_patterns.py in the named tool, as its own request."""
    from gateway.pattern_quote import pattern_reads_quote
    bodies = [_body({"type": "object", "required": [SECRET], "properties": {SECRET: {"type": "string", "pattern": p}}},
                    NAMED) for p in ORDINARY.values() if not pattern_reads_quote(p)]
    for body in bodies:
        r = await stack.client.post(PATH, json=body, headers=stack.auth())
        assert r.status_code == 200, (r.text, body["tools"][1])
    assert [seen.body["tool_choice"] for seen in capture.seen] == [NAMED] * len(bodies)
