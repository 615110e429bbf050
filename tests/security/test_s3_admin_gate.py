"""R3-9: the admin listener authenticates before routing (no route enumeration without
operator credentials) and answers the same failure with the public listener's status and code."""

from __future__ import annotations

from typing import Any

TD = "demo.prefixgate.test"
#: real routes, unknown paths, a real path with the wrong method, a trailing slash
PROBES = [("GET", "/admin/metrics"), ("GET", "/admin/tenants"), ("GET", "/admin/routing"),
          ("GET", "/admin/nonexistent"), ("GET", "/"), ("POST", "/admin/keys/rotate-master"),
          ("DELETE", "/admin/metrics"), ("GET", "/admin/metrics/"), ("POST", "/admin/tenants/reload"),
          ("PUT", "/admin/policies/x"), ("GET", "/metrics")]


def strip(r: Any) -> tuple[int, bytes, dict[str, str]]:
    # date and the request id (R4-5) differ per answer
    return r.status_code, r.content, {k: v for k, v in r.headers.items() if k not in ("date", "x-request-id")}


async def test_every_admin_path_answers_alike_without_operator_credentials(stack: Any) -> None:
    admin = stack.admin_url
    tenant_public = {"Authorization": f"Bearer {stack.token()}"}  # public audience
    tenant_admin = {"Authorization": f"Bearer {stack.token('tenant-a/app', 'prefixgate-admin')}"}
    for headers, status, code in (({}, 401, "missing_token"), (tenant_public, 401, "audience"),
                                  (tenant_admin, 403, "not_an_operator")):
        answers = {(m, p): await stack.client.request(m, admin + p, headers=headers) for m, p in PROBES}
        first = strip(next(iter(answers.values())))
        assert first[0] == status and first[1] and b'"code":"' + code.encode() + b'"' in first[1].replace(b" ", b"")
        for probe, r in answers.items():
            assert strip(r) == first, (probe, r.status_code, r.text)


async def test_same_failure_same_code_on_both_listeners(stack: Any) -> None:
    op_admin = stack.issuer.mint(f"spiffe://{TD}/ops/admin", "prefixgate-admin")
    op_public = stack.issuer.mint(f"spiffe://{TD}/ops/admin", "prefixgate")
    body = {"model": "sim-model", "prompt": "x", "max_tokens": 1}
    public = await stack.client.post("/v1/completions", json=body, headers={"Authorization": f"Bearer {op_admin}"})
    admin = await stack.client.get(f"{stack.admin_url}/admin/routing", headers={"Authorization": f"Bearer {op_public}"})
    assert public.status_code == admin.status_code == 401
    assert public.json()["error"]["code"] == admin.json()["error"]["code"] == "audience"
    assert public.headers["www-authenticate"] == admin.headers["www-authenticate"]
    none_public = await stack.client.post("/v1/completions", json=body)
    none_admin = await stack.client.get(f"{stack.admin_url}/admin/routing")
    assert none_public.json()["error"] == none_admin.json()["error"]


async def test_operator_then_routes(stack: Any) -> None:
    op = stack.operator_auth()
    assert (await stack.client.get(f"{stack.admin_url}/admin/routing", headers=op)).status_code == 200
    r = await stack.client.get(f"{stack.admin_url}/admin/nonexistent", headers=op)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    r = await stack.client.delete(f"{stack.admin_url}/admin/metrics", headers=op)
    assert r.status_code == 405
