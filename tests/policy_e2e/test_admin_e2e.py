"""Operator policy management through the gateway's ADMIN listener (issue 4).

The gateway runs the embedded engine on a COPY of ``rego/`` with a
``policy.versions_dir``, which mounts ``/admin/policies`` and
``/admin/data/...`` (policy.admin) behind the operator guard. Changes that
break compilation or a Rego test are refused and leave routing unchanged;
only configured operator SPIFFE IDs with an admin-audience JWT-SVID may
write; an accepted change takes effect at once (the decision cache is
cleared) and is audited as an operator event.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.policy_store import policy_store_section

TD = "demo.prefixgate.test"
OPERATOR = f"spiffe://{TD}/ops/admin"
ADMIN_AUD = "prefixgate-admin"
WORKLOADS = "prefixgate/config/workloads"
BODY = {"model": "sim-model", "prompt": "admin e2e " + " ".join(f"w{i}" for i in range(40)), "max_tokens": 4}


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    return {"policy": policy_store_section(tmp_path)}


@pytest.fixture
async def admin(stack: Any) -> Any:
    async with httpx.AsyncClient(base_url=stack.admin_url, timeout=20) as client:
        yield client


def op_headers(stack: Any, spiffe_id: str = OPERATOR, audience: str = ADMIN_AUD) -> dict[str, str]:
    return {"Authorization": f"Bearer {stack.issuer.mint(spiffe_id, audience)}"}


def operator_events(log: Any) -> list[Any]:
    return [e for e in log.events if e.kind.value == "operator"]


async def infer(stack: Any, workload: str = "tenant-a/app") -> tuple[int, str | None]:
    """``(status, error code or None)`` of one inference request by ``workload``."""
    r = await stack.client.post("/v1/completions", headers=stack.auth(workload), json=BODY)
    return r.status_code, r.json().get("error", {}).get("code") if r.status_code != 200 else None


async def test_non_operator_identities_are_refused(stack: Any, admin: httpx.AsyncClient, audit_log: Any) -> None:
    src = (await admin.get("/admin/policies/authz.rego", headers=op_headers(stack))).json()["result"]["raw"]
    # a workload with a valid admin-audience JWT-SVID, but not an operator
    workload = op_headers(stack, f"spiffe://{TD}/tenant-a/app")
    for method, path, content in [("GET", "/admin/policies", None),
                                  ("PUT", "/admin/policies/authz.rego", src.encode()),
                                  ("PUT", f"/admin/data/{WORKLOADS}", b'{"denied": []}')]:
        r = await admin.request(method, path, headers=workload, content=content)
        assert r.status_code == 403, (method, path, r.text)
    # the operator's SPIFFE ID with a token for the PUBLIC audience is not an admin credential
    r = await admin.put(f"/admin/data/{WORKLOADS}", headers=op_headers(stack, audience="prefixgate"),
                        content=b'{"denied": []}')
    assert r.status_code in (401, 403)
    assert (await admin.get("/admin/policies")).status_code == 401
    assert operator_events(audit_log) == []
    assert (await infer(stack)) == (200, None)


async def test_broken_uploads_are_refused_and_routing_is_unchanged(
    stack: Any, admin: httpx.AsyncClient, audit_log: Any, tmp_path: Path
) -> None:
    h = op_headers(stack)
    original = (await admin.get("/admin/policies/authz.rego", headers=h)).json()["result"]["raw"]
    before = [await infer(stack, w) for w in ("tenant-a/app", "tenant-reg/app")]
    assert before == [(200, None), (200, None)]

    # 1. does not compile
    r = await admin.put("/admin/policies/authz.rego", headers=h, content=(original + "\nbroken := {\n").encode())
    assert r.status_code == 400 and r.json()["error"]["code"] == "policy_rejected" and r.json()["error"]["errors"]
    # 2. compiles, but lets tenant-reg out of its residency: the residency Rego tests fail
    leaky = original.replace("\tc.labels.data_residency == residency\n", "")
    assert leaky != original
    r = await admin.put("/admin/policies/authz.rego", headers=h, content=leaky.encode())
    assert r.status_code == 400 and r.json()["error"]["code"] == "policy_rejected"
    assert "FAIL" in r.json()["error"]["report"]
    assert (await admin.get("/admin/policies/authz.rego", headers=h)).json()["result"]["raw"] == original
    assert (Path(stack.components.config.policy.dir) / "authz.rego").read_text() == original
    after = [await infer(stack, w) for w in ("tenant-a/app", "tenant-reg/app")]
    assert after == before
    # the replay-level residency rule still holds: tenant-reg only ever reached r2
    reg = [e for e in audit_log.events if e.request_id and e.tenant == "tenant-reg"]
    assert reg and {e.route.replica for e in reg} == {"r2"}
    # no change was committed: no change record; each refused upload is one failed operator event
    # (session 21, S21-newcomer-3), without the uploaded text
    events = operator_events(audit_log)
    assert not any(e.outcome.value == "succeeded" for e in events)
    assert [(e.outcome.value, e.operator["target"], e.error_code, e.status_code) for e in events] == [
        ("failed", "authz.rego", "policy_rejected", 400)] * 2
    assert "broken := {" not in repr([dict(e.operator) for e in events])


async def test_accepted_change_takes_effect_and_is_audited(
    stack: Any, admin: httpx.AsyncClient, audit_log: Any
) -> None:
    h = op_headers(stack)
    # warm the decision cache with an ALLOW for tenant-a/app
    assert (await infer(stack)) == (200, None)
    current = (await admin.get(f"/admin/data/{WORKLOADS}", headers=h)).json()["result"]
    target = f"spiffe://{TD}/tenant-a/app"
    new = {**current, "denied": sorted({*current["denied"], target})}
    r = await admin.put(f"/admin/data/{WORKLOADS}", headers=h, content=json.dumps(new).encode())
    assert r.status_code == 200, r.text
    rec = r.json()["result"]
    assert rec["who"] == OPERATOR and rec["kind"] == "data" and rec["target"] == WORKLOADS
    assert rec["old_sha256"] and rec["new_sha256"] and rec["old_sha256"] != rec["new_sha256"]

    # takes effect at once, despite the cached allow
    assert (await infer(stack)) == (403, "workload_denied")
    # other workloads of the same tenant are unaffected
    assert (await infer(stack, "tenant-a/batch")) == (200, None)

    (ev,) = operator_events(audit_log)
    assert ev.outcome.value == "succeeded" and ev.identity.spiffe_id == OPERATOR
    assert ev.operator["action"] == "policy_change" and ev.operator["target"] == WORKLOADS
    assert (ev.operator["old_sha256"], ev.operator["new_sha256"]) == (rec["old_sha256"], rec["new_sha256"])
    # versioned on disk
    versions = Path(stack.components.config.policy.versions_dir)
    assert json.loads(next(versions.glob("*/record.json")).read_text())["new_sha256"] == rec["new_sha256"]
