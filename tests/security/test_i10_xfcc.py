"""Issue 10, finding 1: a forwarded client certificate (XFCC) is never an identity.

The gateway trusts ``127.0.0.1/32`` as a proxy and has operators configured.
On BOTH listeners every combination is tried: no JWT-SVID + XFCC; JWT-SVID +
matching XFCC (200 only with the listener's audience); JWT-SVID + mismatching
XFCC (401); XFCC from a peer that is not a trusted proxy (the test client
binds 127.0.0.2: the header is ignored, it neither grants nor changes an
identity); an XFCC URI in a trust domain that is not configured (401). Every
admin route is tried without a JWT-SVID, and nothing an admin route changes
(keys, salts, policy) moves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.policy_store import policy_store_section

TD = "demo.prefixgate.test"
OPERATOR = f"spiffe://{TD}/ops/admin"
TENANT_A = f"spiffe://{TD}/tenant-a/app"
TENANT_B = f"spiffe://{TD}/tenant-b/app"
FOREIGN_OP = "spiffe://evil.example/ops/admin"
FOREIGN_A = "spiffe://evil.example/tenant-a/app"
BODY = {"model": "sim-model", "prompt": "xfcc binding check", "max_tokens": 2}
WORKLOADS = "prefixgate/config/workloads"


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    return {
        # the setup: loopback is "the trusted proxy"; a large failure budget
        # so the per-source limiter never answers 429 in this test
        "identity": {"trusted_proxies": ["127.0.0.1/32"], "unauthenticated_burst": 10000},
        "policy": policy_store_section(tmp_path),
    }


def xfcc(uri: str) -> str:
    """The header Envoy sets with ``SANITIZE_SET`` and ``set_current_client_cert_details: {uri: true}``."""
    return f"By=spiffe://{TD}/envoy;Hash=468ed33be74eee6556d90c0149c1309e9ba61d6425303443c0748a02dd8de688;URI={uri}"


def headers(stack: Any, *, jwt_for: str | None = None, audience: str = "prefixgate",
            cert: str | None = None) -> dict[str, str]:
    h: dict[str, str] = {}
    if jwt_for is not None:
        h["Authorization"] = f"Bearer {stack.issuer.mint(jwt_for, audience)}"
    if cert is not None:
        h["X-Forwarded-Client-Cert"] = xfcc(cert)
    return h


@pytest.fixture
async def untrusted(stack: Any) -> AsyncIterator[httpx.AsyncClient]:
    """A client whose socket peer address is 127.0.0.2: loopback, but not a trusted proxy."""
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx.AsyncClient(transport=transport, timeout=20) as client:
        yield client


def assert_401(r: httpx.Response, code: str | None = None) -> None:
    assert r.status_code == 401, (r.request.method, r.request.url.path, r.status_code, r.text)
    assert r.headers["www-authenticate"].startswith('Bearer realm="prefixgate"')
    if code is not None:
        assert r.json()["error"]["code"] == code, r.text


def replica_requests(stack: Any) -> int:
    return sum(s.counters.requests for s in stack.cluster.states)


# ---------------------------------------------------------------- public listener


async def test_public_xfcc_alone_is_not_an_identity(stack: Any) -> None:
    before = replica_requests(stack)
    for cert in (TENANT_A, OPERATOR, FOREIGN_A):
        r = await stack.client.post("/v1/completions", headers=headers(stack, cert=cert), json=BODY)
        assert_401(r, "missing_token")
        r = await stack.client.get("/v1/models", headers=headers(stack, cert=cert))
        assert_401(r, "missing_token")
    assert replica_requests(stack) == before


async def test_public_jwt_with_matching_xfcc(stack: Any) -> None:
    r = await stack.client.post("/v1/completions", headers=headers(stack, jwt_for=TENANT_A, cert=TENANT_A), json=BODY)
    assert r.status_code == 200, r.text
    # the right audience only: the admin audience with a matching certificate is still refused
    r = await stack.client.post("/v1/completions",
                                headers=headers(stack, jwt_for=TENANT_A, audience="prefixgate-admin", cert=TENANT_A),
                                json=BODY)
    assert_401(r, "audience")


async def test_public_jwt_with_mismatching_xfcc(stack: Any) -> None:
    before = replica_requests(stack)
    for jwt_for, cert in ((TENANT_A, TENANT_B), (TENANT_B, TENANT_A), (TENANT_A, OPERATOR)):
        r = await stack.client.post("/v1/completions", headers=headers(stack, jwt_for=jwt_for, cert=cert), json=BODY)
        assert_401(r, "identity_mismatch")
    assert replica_requests(stack) == before


async def test_public_xfcc_in_foreign_trust_domain(stack: Any) -> None:
    before = replica_requests(stack)
    r = await stack.client.post("/v1/completions", headers=headers(stack, cert=FOREIGN_A), json=BODY)
    assert_401(r)
    r = await stack.client.post("/v1/completions", headers=headers(stack, jwt_for=TENANT_A, cert=FOREIGN_A),
                                json=BODY)
    assert_401(r, "invalid_forwarded_certificate")
    # a malformed header from the trusted proxy is refused too (never treated as absent)
    bad = {**headers(stack, jwt_for=TENANT_A), "X-Forwarded-Client-Cert": 'URI="spiffe://unterminated'}
    assert_401(await stack.client.post("/v1/completions", headers=bad, json=BODY), "invalid_forwarded_certificate")
    assert replica_requests(stack) == before


async def test_public_xfcc_from_untrusted_peer_is_ignored(stack: Any, untrusted: httpx.AsyncClient) -> None:
    url = f"{stack.url}/v1/completions"
    r = await untrusted.post(url, headers=headers(stack, cert=TENANT_A), json=BODY)
    assert_401(r, "missing_token")
    # ignored: it cannot switch the tenant nor refuse the caller's own valid token
    for cert in (TENANT_B, FOREIGN_A, OPERATOR):
        r = await untrusted.post(url, headers=headers(stack, jwt_for=TENANT_A, cert=cert), json=BODY)
        assert r.status_code == 200, r.text


# ---------------------------------------------------------------- admin listener


def admin_routes() -> list[tuple[str, str, bytes | None]]:
    """Every admin route (method, path, body)."""
    return [
        ("GET", "/admin/metrics", None),
        ("GET", "/admin/replicas", None),
        ("GET", "/admin/routing", None),
        ("POST", "/admin/tenants/reload", None),
        ("POST", "/admin/tenants/tenant-a/rotate-key", None),
        ("POST", "/admin/tenants/tenant-a/rotate-salt", None),
        ("POST", "/admin/keys/rotate-master", None),
        ("GET", "/admin/policies", None),
        ("GET", "/admin/policies/authz.rego", None),
        ("PUT", "/admin/policies/authz.rego", b"package prefixgate.authz\ndefault allow := true\n"),
        ("DELETE", "/admin/policies/authz.rego", None),
        ("GET", f"/admin/data/{WORKLOADS}", None),
        ("PUT", f"/admin/data/{WORKLOADS}", b'{"denied": []}'),
    ]


async def state(stack: Any, admin: httpx.AsyncClient) -> tuple[Any, ...]:
    """What an admin route could change: key version, salt epoch, key id, policy text, data."""
    kr = stack.components.keyring
    op = headers(stack, jwt_for=OPERATOR, audience="prefixgate-admin")
    policy = (await admin.get("/admin/policies/authz.rego", headers=op)).json()["result"]["raw"]
    data = (await admin.get(f"/admin/data/{WORKLOADS}", headers=op)).json()["result"]
    return kr.key_version("tenant-a"), kr.salt_epoch("tenant-a"), kr.current("tenant-a").kid, policy, data


@pytest.fixture
async def admin(stack: Any) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=stack.admin_url, timeout=20) as client:
        yield client


async def test_admin_xfcc_alone_is_refused_on_every_route(stack: Any, admin: httpx.AsyncClient) -> None:
    before = await state(stack, admin)
    for method, path, body in admin_routes():
        for cert in (OPERATOR, FOREIGN_OP):
            r = await admin.request(method, path, headers=headers(stack, cert=cert), content=body)
            assert_401(r)
    assert await state(stack, admin) == before


async def test_admin_jwt_with_matching_xfcc(stack: Any, admin: httpx.AsyncClient) -> None:
    op = headers(stack, jwt_for=OPERATOR, audience="prefixgate-admin", cert=OPERATOR)
    assert (await admin.get("/admin/routing", headers=op)).status_code == 200
    version = stack.components.keyring.key_version("tenant-a")
    r = await admin.post("/admin/tenants/tenant-a/rotate-key", headers=op)
    assert r.status_code == 200, r.text
    assert stack.components.keyring.key_version("tenant-a") == version + 1
    # the public audience, even an operator's with a matching certificate, is refused here
    pub = headers(stack, jwt_for=OPERATOR, audience="prefixgate", cert=OPERATOR)
    assert_401(await admin.get("/admin/routing", headers=pub), None)


async def test_admin_jwt_with_mismatching_xfcc(stack: Any, admin: httpx.AsyncClient) -> None:
    before = await state(stack, admin)
    cases = [(OPERATOR, TENANT_A),   # an operator's stolen token replayed over a tenant's mTLS connection
             (TENANT_A, OPERATOR)]   # a tenant's token with an operator's certificate asserted
    for method, path, body in admin_routes():
        for jwt_for, cert in cases:
            h = headers(stack, jwt_for=jwt_for, audience="prefixgate-admin", cert=cert)
            assert_401(await admin.request(method, path, headers=h, content=body))
    assert await state(stack, admin) == before


async def test_admin_xfcc_in_foreign_trust_domain(stack: Any, admin: httpx.AsyncClient) -> None:
    before = await state(stack, admin)
    for method, path, body in admin_routes()[:5]:
        h = headers(stack, jwt_for=OPERATOR, audience="prefixgate-admin", cert=FOREIGN_OP)
        assert_401(await admin.request(method, path, headers=h, content=body))
    assert await state(stack, admin) == before


async def test_admin_xfcc_from_untrusted_peer_is_ignored(stack: Any, admin: httpx.AsyncClient,
                                                        untrusted: httpx.AsyncClient) -> None:
    before = await state(stack, admin)
    for method, path, body in admin_routes():
        r = await untrusted.request(method, f"{stack.admin_url}{path}", headers=headers(stack, cert=OPERATOR),
                                    content=body)
        assert_401(r)
    assert await state(stack, admin) == before
    # ignored: an operator's own token still works, the asserted certificate plays no part
    for cert in (TENANT_A, FOREIGN_OP):
        h = headers(stack, jwt_for=OPERATOR, audience="prefixgate-admin", cert=cert)
        assert (await untrusted.get(f"{stack.admin_url}/admin/routing", headers=h)).status_code == 200
    # ... and a tenant's admin-audience token is still not an operator's, whatever it asserts
    h = headers(stack, jwt_for=TENANT_A, audience="prefixgate-admin", cert=OPERATOR)
    assert (await untrusted.get(f"{stack.admin_url}/admin/routing", headers=h)).status_code == 403
