"""Policy store (validation, versions, restart), remote target, admin routes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.testclient import TestClient

from policy.admin import admin_routes
from policy.embedded import EmbeddedOpa
from policy.remote import RemoteOpa
from policy.store import ChangeRecord, PolicyRejectedError, PolicyStore, RemoteOpaTarget, check_policy_dir

#: these tests are about versions, not the 50 ms production deadline: the first decision after a
#: load waits for the engine on a loaded machine (CI run of session 9 start: deadline exceeded)
LOADED_MACHINE_DEADLINE_S = 5.0

TIERS = "prefixgate/config/tiers"


async def test_broken_upload_refused_and_decisions_unchanged(active: Path, tmp_path: Path, mk: Any) -> None:
    opa = EmbeddedOpa(active, timeout_s=LOADED_MACHINE_DEADLINE_S)
    records: list[ChangeRecord] = []
    store = PolicyStore(active, tmp_path / "versions", target=opa, on_change=records.append)
    before = await opa.decide(mk("tenant-a"))
    original = store.get_policy("authz.rego")

    with pytest.raises(PolicyRejectedError) as exc:
        await store.put_policy("authz.rego", original + "\nbroken := {", "op@x")
    assert exc.value.report.errors
    # compiles, but breaks a Rego unit test (standard cap 1024 -> 999)
    with pytest.raises(PolicyRejectedError) as exc2:
        await store.put_policy("authz.rego", original.replace("max_tokens := min(token_caps)", "max_tokens := 999"), "op@x")
    assert exc2.value.report.failed > 0

    after = await opa.decide(mk("tenant-a"))
    assert (after.allow, after.max_tokens, after.allowed_replicas) == (before.allow, before.max_tokens, before.allowed_replicas)
    assert store.get_policy("authz.rego") == original
    assert (active / "authz.rego").read_text() == original
    assert records == [] and store.version == 0 and opa.revision == 0


async def test_accepted_change_is_versioned_and_survives_restart(active: Path, tmp_path: Path, mk: Any) -> None:
    opa = EmbeddedOpa(active, timeout_s=LOADED_MACHINE_DEADLINE_S)
    records: list[ChangeRecord] = []
    store = PolicyStore(active, tmp_path / "versions", target=opa, on_change=records.append)
    tiers = store.get_data(TIERS)
    old_text_digest = store.list_data()
    tiers["gold"] = {"max_tokens": 2048}
    rec = await store.put_data(TIERS, tiers, "spiffe://prefixgate.test/ops/alice")
    gold = {"tier": "gold", "models": ["sim-model"], "pools": ["default"]}

    assert records == [rec] and rec.version == 1 and rec.kind == "data" and rec.op == "put"
    assert rec.who == "spiffe://prefixgate.test/ops/alice"
    assert rec.old_sha256 == next(d["sha256"] for d in old_text_digest if d["path"] == TIERS)
    assert rec.new_sha256 != rec.old_sha256
    assert (await opa.decide(mk("tenant-z", entitlements=gold))).max_tokens == 2048

    restarted = PolicyStore(active, tmp_path / "versions")
    assert restarted.version == 1
    assert "gold" in restarted.get_data(TIERS)
    assert [r.version for r in restarted.history()] == [1]
    assert (await EmbeddedOpa(active, timeout_s=LOADED_MACHINE_DEADLINE_S).decide(mk("tenant-z", entitlements=gold))).max_tokens == 2048

    rec2 = await store.put_policy("extra.rego", "package prefixgate.extra\n\nx := 1\n", "ops")
    assert rec2.version == 2 and rec2.old_sha256 is None
    rec3 = await store.delete_policy("extra.rego", "ops")
    assert rec3.new_sha256 is None and not (active / "extra.rego").exists()


async def test_remote_target_pushes_validated_changes(active: Path, tmp_path: Path, fresh_opa_server: Any, mk: Any) -> None:
    server, state = fresh_opa_server
    async with RemoteOpa(server.url, timeout_s=5.0) as remote:
        changes: list[int] = []
        remote.add_change_listener(lambda: changes.append(1))
        store = PolicyStore(active, tmp_path / "versions", target=RemoteOpaTarget(remote.client, remote.notify_change))
        tiers = store.get_data(TIERS)
        tiers["standard"] = {"max_tokens": 55}
        await store.put_data(TIERS, tiers, "ops")
        d = await remote.decide(mk("tenant-a"))
        assert (d.allow, d.max_tokens) == (True, 55)
        assert changes == [1]
        with pytest.raises(PolicyRejectedError):
            await store.put_policy("authz.rego", "package prefixgate.authz\ndecision := {", "ops")
        assert state.modules["authz.rego"] == (active / "authz.rego").read_text()


def test_check_policy_dir(rego_dir: Path, tmp_path: Path) -> None:
    assert check_policy_dir(rego_dir).ok
    (tmp_path / "bad.rego").write_text("package bad\nallow if {")
    report = check_policy_dir(tmp_path)
    assert not report.ok and report.errors


def _app(store: PolicyStore) -> TestClient:
    async def authorize(request: Request) -> dict[str, Any]:
        role = request.headers.get("x-test-role")
        if role is None:
            raise HTTPException(401, "no credentials")
        if role != "operator":
            raise HTTPException(403, "not an operator")
        return {"spiffe_id": "spiffe://prefixgate.test/ops/alice"}

    return TestClient(Starlette(routes=admin_routes(store, authorize)))


def test_admin_routes_require_operator(active: Path, tmp_path: Path) -> None:
    store = PolicyStore(active, tmp_path / "versions")
    client = _app(store)
    for method, url in [("GET", "/admin/policies"), ("GET", "/admin/policies/authz.rego"),
                        ("PUT", "/admin/policies/x.rego"), ("DELETE", "/admin/policies/authz.rego"),
                        ("GET", f"/admin/data/{TIERS}"), ("PUT", f"/admin/data/{TIERS}")]:
        assert client.request(method, url, headers={"x-test-role": "tenant"}, content=b"{}").status_code == 403
        assert client.request(method, url, content=b"{}").status_code == 401
    assert store.version == 0 and "authz.rego" in store.policy_set.modules


def test_admin_routes_for_operator(active: Path, tmp_path: Path) -> None:
    store = PolicyStore(active, tmp_path / "versions")
    client = _app(store)
    h = {"x-test-role": "operator"}
    ids = [p["id"] for p in client.get("/admin/policies", headers=h).json()["result"]]
    assert "authz.rego" in ids and "authz_test.rego" in ids
    got = client.get("/admin/policies/authz.rego", headers=h).json()["result"]
    assert got["raw"] == store.get_policy("authz.rego")
    assert client.get("/admin/policies/nope.rego", headers=h).status_code == 404

    bad = client.put("/admin/policies/authz.rego", headers=h, content=b"package prefixgate.authz\ndecision := {")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "policy_rejected"
    ok = client.put("/admin/policies/extra.rego", headers=h, content=b"package prefixgate.extra\n\ny := 2\n")
    assert ok.status_code == 200 and ok.json()["result"]["who"] == "spiffe://prefixgate.test/ops/alice"

    tiers = client.get(f"/admin/data/{TIERS}", headers=h).json()["result"]
    assert "premium" in tiers
    same = client.put(f"/admin/data/{TIERS}", headers=h, content=json.dumps(tiers))  # session 26: no version
    assert same.status_code == 200 and same.json()["unchanged"] is True and same.json()["result"]["version"] == 1
    tiers["standard"] = {**tiers["standard"], "max_tokens": 8}
    put = client.put(f"/admin/data/{TIERS}", headers=h, content=json.dumps(tiers))
    assert put.status_code == 200 and put.json()["result"]["version"] == 2
    assert client.put(f"/admin/data/{TIERS}", headers=h, content=b"[1]").status_code == 400
    assert client.put("/admin/policies/..%2Fescape.rego", headers=h, content=b"package x").status_code in (400, 404)
    assert client.delete("/admin/policies/extra.rego", headers=h).status_code == 200
