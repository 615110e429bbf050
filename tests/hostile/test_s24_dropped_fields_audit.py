"""Session 24 (S23-fields-4): in ``limits.unknown_fields: drop`` mode the audit event records how many top-level
fields were dropped (``dropped_fields``, schema "5"; OCSF ``unmapped.prefixgate.dropped_fields``; CEF ``cfp3`` /
``droppedFields``), never their names. A request without dropped fields has none of it.

Before: the 200's headers said it, the audit event did not (the field did not exist).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from audit.cef import cef_line, format_cef, parse_cef
from audit.ocsf import ocsf_line, to_ocsf
from tests.hostile.conftest import stable_master_secret
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

SECRET = "my secret prompt text: the launch code is 1234"


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Any) -> dict[str, Any]:
    return {"tenancy": {"master_secret_file": stable_master_secret(tmp_path)},
            "replicas": [{"id": "r0", "url": capture.urls[0], "pool": "default"}],
            "limits": {"unknown_fields": "drop"}}


@pytest.mark.parametrize("path, body", [
    ("/v1/chat/completions", {"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"model": "sim-model", "max_tokens": 4, "prompt": "hello there"}),
])
async def test_the_drop_count_reaches_every_format(stack: Any, capture: Any, audit_log: ListLog,  # noqa: F811
                                                    path: str, body: dict[str, Any]) -> None:
    r = await stack.client.post(path, json={**body, "guided_regex": "(a+)+$", SECRET: 1}, headers=stack.auth())
    assert r.status_code == 200, r.text
    r = await stack.client.post(path, json=body, headers=stack.auth())
    assert r.status_code == 200, r.text
    dropped, plain = [e for e in audit_log.events if getattr(e, "endpoint", None) == path]
    assert dropped.dropped_fields == 2 and plain.dropped_fields is None
    d = dropped.to_dict()
    assert d["dropped_fields"] == 2 and "dropped_fields" not in plain.to_dict()
    assert json.loads(dropped.to_json())["dropped_fields"] == 2
    assert json.loads(ocsf_line(dropped))["unmapped"]["prefixgate"]["dropped_fields"] == 2
    assert to_ocsf(dropped)["unmapped"]["prefixgate"]["dropped_fields"] == 2
    assert "dropped_fields" not in json.loads(ocsf_line(plain))["unmapped"]["prefixgate"]
    _, ext = parse_cef(cef_line(dropped))
    assert (ext["cfp3Label"], ext["cfp3"]) == ("droppedFields", "2") and cef_line(dropped) == format_cef(dropped)
    assert "cfp3" not in parse_cef(cef_line(plain))[1]
    for text in (json.dumps(d), ocsf_line(dropped).decode(), cef_line(dropped)):
        assert "launch code" not in text and "guided_regex" not in text  # the count, never a name


async def test_a_later_refusal_keeps_the_count(stack: Any, capture: Any, audit_log: ListLog) -> None:  # noqa: F811
    body = {"model": "no-such-model", "max_tokens": 4, "prompt": "hello", "priority": 1}
    r = await stack.client.post("/v1/completions", json=body, headers=stack.auth())
    assert r.status_code == 404, r.text
    [event] = [e for e in audit_log.events if getattr(e, "endpoint", None) == "/v1/completions"]
    assert event.dropped_fields == 1 and event.error_code == "model_not_found"
