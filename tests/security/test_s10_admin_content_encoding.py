"""Session 10 lows: the admin listener's uploads ignored ``Content-Encoding``.

Session 9 (R9-4) made the public API answer **415** ``unsupported_content_encoding`` for a body
labelled with any coding but ``identity``; the admin API's policy, data and registry routes still
read such a body as identity (a policy labelled ``br`` was compiled and installed; a proxy or WAF
in front that inflates before inspecting saw other bytes than the gateway). Now the operator gate
applies the same rule: 415 with ``Accept-Encoding: identity``, nothing changed, one audit event
(endpoint ``admin``, the operator's identity); non-operators still get their 401/403 first.
"""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.content_coding import CODE
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.policy_store import policy_store_section

POLICY = "/admin/policies/authz.rego"
DATA = "/admin/data/prefixgate/config/tiers"


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    """A policy store (copied Rego, a versions folder): the admin policy and data routes exist."""
    return {"policy": policy_store_section(tmp_path)}


@pytest.fixture
async def admin(stack: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.admin_url, timeout=20) as client:
        yield client


async def _policy(admin: httpx.AsyncClient, stack: Any) -> str:
    r = await admin.get(POLICY, headers=stack.operator_auth())
    assert r.status_code == 200, r.text
    return str(r.json()["result"]["raw"])


def _admin_refusals(log: ListLog) -> list[Any]:
    return [e for e in log.events if getattr(e, "endpoint", None) == "admin" and getattr(e, "status_code", 0) == 415]


@pytest.mark.parametrize("encoding", ["gzip", "br", "x-unknown", "identity, deflate", "GZIP"])
async def test_a_content_coded_policy_upload_is_refused_with_415(stack: Any, admin: httpx.AsyncClient,
                                                                  audit_log: ListLog, encoding: str) -> None:
    before = await _policy(admin, stack)
    text = before + "\n# changed by the test\n"
    body = gzip.compress(text.encode()) if encoding.lower().endswith("gzip") else text.encode()
    r = await admin.put(POLICY, content=body, headers={**stack.operator_auth(), "Content-Type": "text/plain",
                                                         "Content-Encoding": encoding})
    assert r.status_code == 415, (r.status_code, r.text)  # before: 200 (the upload installed), gzip: 400
    assert r.json()["error"]["code"] == CODE
    assert r.headers["accept-encoding"] == "identity"
    assert await _policy(admin, stack) == before  # nothing installed
    events = _admin_refusals(audit_log)
    assert [(e.error_code, e.identity.spiffe_id) for e in events] == [(CODE, "spiffe://demo.prefixgate.test/ops/admin")]
    assert r.headers["x-request-id"] == events[0].request_id


@pytest.mark.parametrize(("method", "path", "body"), [
    ("PUT", DATA, b'{"standard": {"max_tokens": 7}}'),
    ("POST", "/admin/tenants/reload", b""),
    ("POST", "/admin/tenants/tenant-a/rotate-key", b""),
])
async def test_every_admin_upload_route_refuses_a_coded_body(stack: Any, admin: httpx.AsyncClient,
                                                             audit_log: ListLog, method: str, path: str,
                                                             body: bytes) -> None:
    kr = stack.components.keyring
    version = kr.key_version("tenant-a")
    data = (await admin.get(DATA, headers=stack.operator_auth())).json()
    r = await admin.request(method, path, content=body, headers={**stack.operator_auth(), "Content-Encoding": "br"})
    assert r.status_code == 415, (r.status_code, r.text)
    assert r.json()["error"]["code"] == CODE
    assert kr.key_version("tenant-a") == version
    assert (await admin.get(DATA, headers=stack.operator_auth())).json() == data
    assert len(_admin_refusals(audit_log)) == 1


async def test_identity_and_no_field_are_served(stack: Any, admin: httpx.AsyncClient) -> None:
    before = await _policy(admin, stack)
    for extra in ({}, {"Content-Encoding": "identity"}, {"Content-Encoding": ""}):
        r = await admin.put(POLICY, content=before.encode(),
                            headers={**stack.operator_auth(), "Content-Type": "text/plain", **extra})
        assert r.status_code == 200, (extra, r.status_code, r.text)
    r = await admin.get("/admin/routing", headers={**stack.operator_auth(), "Content-Encoding": "identity"})
    assert r.status_code == 200


async def test_non_operators_get_their_own_refusal_first(stack: Any, admin: httpx.AsyncClient) -> None:
    """The 415 comes after the operator check: no hint to a caller who is not an operator."""
    coded = {"Content-Encoding": "gzip"}
    r = await admin.put(POLICY, content=b"x", headers=coded)
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_token"
    tenant = {"Authorization": f"Bearer {stack.token('tenant-a/app', 'prefixgate-admin')}", **coded}
    r = await admin.put(POLICY, content=b"x", headers=tenant)
    assert r.status_code == 403 and r.json()["error"]["code"] == "not_an_operator"
