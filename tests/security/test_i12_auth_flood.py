"""Issue 12, finding 1: other people's bad tokens must not lock a tenant out.

Before: 60 bad tokens from one source, then every request from that source,
valid tenant and operator tokens included, got 429
``too_many_unauthenticated`` (the per-source bucket was checked before any
token and every refusal took from it).

Here the per-source budget is deliberately tiny (40 failed signature checks,
refilling at 0.01/s) so that the block is reached within the test:

* 60+ tokens with a bad signature from one source, then tokens already
  verified (tenant on the public listener, operator on the admin listener)
  are still accepted; a freshly minted token, which needs a signature check,
  is refused with 429 while the source is blocked;
* 200 each of malformed, unknown-kid and expired tokens never raise the
  block: a fresh valid token still verifies, and no signature was checked;
* blocked refusals reach the audit trail as ``too_many_unauthenticated``
  events of that source (aggregated by the audit log, see
  tests/audit/test_i12_blocked_summary.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.auditing import AuditHub
from sim.spiffe_issuer import DemoIssuer
from tests.support.audit_log import ListLog as CaptureLog

TD = "demo.prefixgate.test"
TENANT = f"spiffe://{TD}/tenant-a/app"
OPERATOR = f"spiffe://{TD}/ops/admin"
BODY = {"model": "sim-model", "prompt": "hello from a tenant behind a busy NAT", "max_tokens": 2}


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.fixture
def capture() -> CaptureLog:
    return CaptureLog()


@pytest.fixture
def audit_hub(capture: CaptureLog) -> AuditHub:
    return AuditHub(capture)


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"identity": {"unauthenticated_rps": 0.01, "unauthenticated_burst": 40}}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def flood_bad_signatures(stack: Any, n: int = 60) -> list[int]:
    forger = DemoIssuer(TD)
    statuses = []
    for i in range(n):
        tok = forger.mint(TENANT, "prefixgate", headers={"kid": stack.issuer.kid}, jti=f"bad-{i}")
        r = await stack.client.get("/v1/models", headers=bearer(tok))
        statuses.append(r.status_code)
    return statuses


async def test_bad_signature_flood_does_not_lock_out_verified_tokens(stack: Any) -> None:
    tenant_tok = stack.token("tenant-a/app")
    op_tok = stack.issuer.mint(OPERATOR, "prefixgate-admin")
    assert (await stack.client.post("/v1/completions", headers=bearer(tenant_tok), json=BODY)).status_code == 200
    assert (await stack.client.get(f"{stack.admin_url}/admin/routing", headers=bearer(op_tok))).status_code == 200
    # 60+ bad signatures on each listener from this one source
    statuses = await flood_bad_signatures(stack, 60)
    assert statuses[0] == 401 and statuses[-1] == 429, statuses
    forger = DemoIssuer(TD)
    for i in range(60):
        tok = forger.mint(OPERATOR, "prefixgate-admin", headers={"kid": stack.issuer.kid}, jti=f"op-{i}")
        await stack.client.get(f"{stack.admin_url}/admin/routing", headers=bearer(tok))
    # the tenant's and the operator's already-verified tokens still work
    r = await stack.client.post("/v1/completions", headers=bearer(tenant_tok), json=BODY)
    assert r.status_code == 200, r.text
    r = await stack.client.get("/v1/models", headers=bearer(tenant_tok))
    assert r.status_code == 200, r.text
    r = await stack.client.get(f"{stack.admin_url}/admin/routing", headers=bearer(op_tok))
    assert r.status_code == 200, r.text


async def test_fresh_token_at_blocked_source_is_429_verified_one_200(stack: Any, capture: CaptureLog) -> None:
    seen = stack.token("tenant-b/app")
    assert (await stack.client.get("/v1/models", headers=bearer(seen))).status_code == 200
    statuses = await flood_bad_signatures(stack, 60)
    assert 429 in statuses
    checks = stack.components.verifier.signature_checks
    fresh = stack.token("tenant-a/app", jti="fresh-one")
    r = await stack.client.post("/v1/completions", headers=bearer(fresh), json=BODY)
    assert r.status_code == 429, r.text
    assert r.json()["error"]["code"] == "too_many_unauthenticated"
    assert int(r.headers["retry-after"]) >= 1
    assert stack.components.verifier.signature_checks == checks  # refused instead of checked
    r = await stack.client.post("/v1/completions", headers=bearer(seen), json=BODY)
    assert r.status_code == 200, r.text
    # blocked refusals are audited with the source and the reason code
    blocked = [e for e in capture.events if e.policy.reason_code == "too_many_unauthenticated"]
    assert blocked and all(e.client_address == "127.0.0.1" for e in blocked)


@pytest.mark.parametrize("kind", ["malformed", "unknown_kid", "expired"])
async def test_cheap_refusals_never_raise_the_block(stack: Any, kind: str) -> None:
    forger = DemoIssuer(TD)
    checks = stack.components.verifier.signature_checks
    for i in range(200):
        if kind == "malformed":
            tok = f"eyJhbGciOiJFUzI1NiJ9.{i}.x"
        elif kind == "unknown_kid":
            tok = forger.mint(TENANT, "prefixgate", headers={"kid": f"nope-{i}"})
        else:
            tok = stack.issuer.mint(TENANT, "prefixgate", ttl_s=10, iat=None, now=1_000_000 + i)
        r = await stack.client.get("/v1/models", headers=bearer(tok))
        assert r.status_code == 401, (kind, i, r.text)
        assert r.json()["error"]["code"] == {"malformed": "malformed", "unknown_kid": "unknown_kid",
                                             "expired": "expired"}[kind]
    assert stack.components.verifier.signature_checks == checks, "a cheap refusal cost a signature check"
    fresh = stack.token("tenant-a/app", jti=f"fresh-after-{kind}")
    r = await stack.client.post("/v1/completions", headers=bearer(fresh), json=BODY)
    assert r.status_code == 200, r.text
