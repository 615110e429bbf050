"""What the HTTP tests of ``limits.json_schema`` share (one copy since session 31, tidy31, of the config fixture and
the request helpers sessions 27-30 wrote in each file): a chat body carrying a schema as ``response_format`` or as a
tool's ``parameters``, the gateway config of tenants on the recording replica ``r0`` of tests/hostile/conftest.py
``capture``, and the two outcomes (400 ``json_schema_too_complex`` with nothing forwarded; 200 with the schema
forwarded as sent).

Import :func:`config_overrides` into a test module as a fixture (``tenant-a`` alone), or build another tenant set
with :func:`capture_config` in the module's own ``config_overrides``. The requesting module must see a ``capture``
fixture (tests/hostile/ through its conftest; elsewhere import it from tests.hostile.conftest).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TD
from tests.hostile.conftest import stable_master_secret
from tests.support.audit_log import ListLog

__all__ = ["PATH", "capture_config", "chat", "config_overrides", "forwarded", "named_tool", "refused",
           "refused_and_audited", "request_event", "rf", "tools"]

#: the endpoint every request here is sent to
PATH = "/v1/chat/completions"


def chat(**extra: Any) -> dict[str, Any]:
    """A chat body for ``sim-model`` (4 tokens, one user message) with ``extra``'s fields."""
    return {"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": "hello there"}], **extra}


def rf(schema: Any) -> dict[str, Any]:
    """``{"response_format": ...}``: ``schema`` as a ``json_schema`` response format named ``answer``."""
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}}


def tools(schema: Any) -> dict[str, Any]:
    """``{"tools": ...}``: one function ``f`` whose ``parameters`` are ``schema``."""
    return {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}


def named_tool(schema: Any) -> dict[str, Any]:
    """A :func:`chat` body with :func:`tools` of ``schema`` and a ``tool_choice`` naming that tool."""
    body = chat(**tools(schema))
    body["tool_choice"] = {"type": "function", "function": {"name": body["tools"][0]["function"]["name"]}}
    return body


def request_event(audit_log: ListLog) -> Any:
    """The one audit event of a request to :data:`PATH`; raises ValueError when there is none or more than one."""
    [event] = [e for e in audit_log.events if getattr(e, "endpoint", None) == PATH]
    return event


def capture_config(capture: Any, tmp_path: Path, limits_of: dict[str, dict[str, Any] | None] | None = None,
                   **sections: Any) -> dict[str, Any]:
    """The gateway's ``config_overrides``: the tenants of ``limits_of`` (tenant id -> its ``json_schema_limits``,
    None for none; default ``tenant-a`` alone), each with the workload prefix ``spiffe://<TD>/<id>/``, model
    ``sim-model``, pool ``default`` and 64 output tokens; replica ``r0`` at ``capture.urls[0]``; a master secret file
    under ``tmp_path``; and ``sections`` (e.g. ``limits={...}``) as more top-level keys."""
    tenants = []
    for tenant_id, limits in (limits_of or {"tenant-a": None}).items():
        tenant: dict[str, Any] = {"id": tenant_id, "spiffe_ids": [f"spiffe://{TD}/{tenant_id}/"],
                                  "models": ["sim-model"], "pools": ["default"], "max_output_tokens": 64}
        if limits is not None:
            tenant["json_schema_limits"] = limits
        tenants.append(tenant)
    return {"tenancy": {"master_secret_file": stable_master_secret(tmp_path), "tenants": tenants},
            "replicas": [{"id": "r0", "url": capture.urls[0], "pool": "default"}], **sections}


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Path) -> dict[str, Any]:
    """:func:`capture_config` with ``tenant-a`` alone."""
    return capture_config(capture, tmp_path)


def refused(r: Any, capture: Any, bound: str | None = None) -> dict[str, Any]:
    """Assert that the response ``r`` is a 400 ``json_schema_too_complex`` (whose message names
    ``limits.json_schema.<bound>`` when ``bound`` is given) and that ``capture`` saw no request; its ``error``."""
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "json_schema_too_complex"
    if bound is not None:
        assert f"limits.json_schema.{bound}" in err["message"]
    assert capture.seen == []
    return err


async def refused_and_audited(stack: Any, capture: Any, audit_log: ListLog, schema: Any, bound: str,
                              *hidden: str) -> dict[str, Any]:
    """Send ``schema`` as an :func:`rf` request as ``tenant-a/app`` and assert it :func:`refused` naming ``bound``,
    with one audit event (:func:`request_event`) ``(400, "json_schema_too_complex", "rejected")`` whose reason is
    ``response_format over limits.json_schema.<bound>`` and whose JSON holds none of ``hidden``; the ``error``."""
    r = await stack.client.post(PATH, json=chat(**rf(schema)), headers=stack.auth())
    err = refused(r, capture, bound)
    event = request_event(audit_log)
    assert (event.status_code, event.error_code, event.outcome.value) == (400, "json_schema_too_complex", "rejected")
    assert event.policy.reason == f"response_format over limits.json_schema.{bound}"
    text = json.dumps(event.to_dict())
    assert not [h for h in hidden if h in text]
    return err


async def forwarded(stack: Any, capture: Any, schemas: list[Any], workload: str = "tenant-a/app") -> None:
    """Send each of ``schemas`` as its own :func:`rf` request as ``workload``; assert each answered 200 and that
    ``capture`` saw exactly those schemas, in order."""
    for schema in schemas:
        r = await stack.client.post(PATH, json=chat(**rf(schema)), headers=stack.auth(workload))
        assert r.status_code == 200, (r.text, schema)
    assert [seen.body["response_format"]["json_schema"]["schema"] for seen in capture.seen] == schemas
