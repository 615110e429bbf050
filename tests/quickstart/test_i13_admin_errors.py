"""Issue 13: one error shape for every admin route, the public API's
(``{"error": {"message", "type", "code", "param"}}``, gateway/errors.py).

Before the fix the admin listener answered in three shapes: the gateway's own
(authentication, unknown routes), ``{"error": code, "detail"}`` (tenancy
routes) and ``{"code", "message"}`` (policy routes).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from gateway.errors import GatewayError
from policy.admin import error_body as policy_error_body
from tenancy.admin import error_body as tenancy_error_body

TD = "demo.prefixgate.test"
OPERATOR = f"spiffe://{TD}/ops/admin"
ADMIN_AUD = "prefixgate-admin"


@pytest.mark.parametrize("status", [400, 401, 403, 404, 405, 409, 413, 415, 429, 500, 501, 502, 503])
def test_admin_error_bodies_are_the_gateway_shape(status: int) -> None:
    want = GatewayError(status, "some_code", "some message").body()
    assert tenancy_error_body(status, "some_code", "some message") == want
    assert policy_error_body(status, "some_code", "some message") == want


@pytest.fixture
def config_overrides(tmp_path: Any) -> dict[str, Any]:
    import shutil

    from rego import policy_dir

    active = tmp_path / "rego-active"
    shutil.copytree(policy_dir(), active, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
    return {"policy": {"mode": "embedded", "dir": str(active), "versions_dir": str(tmp_path / "versions")}}


# (method, path, body, operator token?) -> one refusal of every admin route family
CASES = [
    ("GET", "/admin/replicas", None, False),                      # no credential: 401
    ("GET", "/admin/nope", None, True),                           # unknown route: 404
    ("GET", "/admin/replicas", None, "tenant"),                   # not an operator: 403
    ("POST", "/admin/tenants/nope/rotate-key", None, True),       # tenancy: unknown tenant 404
    ("POST", "/admin/tenants/-bad/rotate-salt", None, True),      # tenancy: bad id 400
    ("POST", "/admin/keys/rotate-master", None, True),            # tenancy: unchanged master 409
    ("PUT", "/admin/policies/authz.rego", b"package prefixgate.authz\ndecision := {", True),  # policy 400
    ("GET", "/admin/policies/nope.rego", None, True),             # policy: 404
    ("PUT", "/admin/data/extra/doc", b"[1]", True),               # data: 400
    ("PATCH", "/admin/policies/authz.rego", b"x", True),          # 405
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]} {c[1]}" for c in CASES])
async def test_every_admin_refusal_has_the_public_error_shape(stack: Any, case: Any) -> None:
    method, path, body, who = case
    headers = {}
    if who is True:
        headers["Authorization"] = f"Bearer {stack.issuer.mint(OPERATOR, ADMIN_AUD)}"
    elif who == "tenant":
        headers["Authorization"] = f"Bearer {stack.issuer.mint(f'spiffe://{TD}/tenant-a/app', ADMIN_AUD)}"
    async with httpx.AsyncClient(base_url=stack.admin_url, timeout=30) as admin:
        r = await admin.request(method, path, headers=headers, content=body)
    assert 400 <= r.status_code < 600, r.text
    assert r.headers["content-type"].startswith("application/json")
    doc = r.json()
    assert set(doc) == {"error"}, doc
    err = doc["error"]
    assert {"message", "type", "code", "param"} <= set(err), err
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["code"], str) and err["code"]
    assert err["type"] == GatewayError(r.status_code, "x", "x").err_type, (r.status_code, err)
    # the same top-level shape as a public refusal
    pub = await stack.client.get("/v1/models")
    assert set(pub.json()) == {"error"} and set(pub.json()["error"]) <= set(err) | {"decision_id"}
