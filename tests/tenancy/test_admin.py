from __future__ import annotations

import base64
import os

import pytest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.testclient import TestClient

from tenancy.admin import admin_routes, rotate_tenant_key, rotate_tenant_salt
from tenancy.keys import KeyRing, load_master_secret
from tenancy.registry import TenantRegistry

MASTER = b"admin-test-master-secret-0123456789abcdef"
NEW_MASTER = b"admin-test-NEW-master-secret-0123456789ab"
OPERATOR = "spiffe://td/ops/alice"

CONFIG = [
    {"id": "acme", "spiffe_ids": ["spiffe://td/ns/acme/"]},
    {"id": "beta", "spiffe_ids": ["spiffe://td/ns/beta/"]},
]


async def fake_authorize(request: Request) -> str:
    who = request.headers.get("x-test-spiffe-id")
    if who is None:
        raise HTTPException(401, "no identity")
    if who != OPERATOR:
        raise HTTPException(403, "not an operator")
    return who


class Harness:
    def __init__(self, tmp_path, master_file: bool = True) -> None:
        self.ring = KeyRing(MASTER, grace_s=60, state_path=str(tmp_path / "state.json"))
        self.registry = TenantRegistry.from_config(CONFIG)
        self.records: list[dict] = []
        self.config = list(CONFIG)
        self.master_path = tmp_path / "master"
        self.master_path.write_bytes(NEW_MASTER)
        os.chmod(self.master_path, 0o600)

        def loader() -> TenantRegistry:
            return self.registry.reload(self.config)

        async def on_change(record: dict) -> None:
            self.records.append(record)

        routes = admin_routes(
            self.ring,
            loader,
            fake_authorize,
            master_loader=(lambda: load_master_secret(str(self.master_path), None)) if master_file else None,
            on_change=on_change,
            registry=self.registry,
        )
        self.client = TestClient(Starlette(routes=routes))

    def secrets(self) -> list[str]:
        out = []
        for tid in ("acme", "beta"):
            for k in self.ring.lookup_keys(tid):
                out += [k.key.hex(), base64.b64encode(k.key).decode(), base64.urlsafe_b64encode(k.key).decode()]
        for m in (MASTER, NEW_MASTER):
            out += [m.decode(), m.hex()]
        return out

    def assert_no_secrets(self, text: str) -> None:
        for s in self.secrets():
            assert s not in text
        for tid in ("acme", "beta"):
            assert self.ring.cache_salt(tid) not in text


OPS = ["/admin/tenants/acme/rotate-key", "/admin/tenants/acme/rotate-salt", "/admin/keys/rotate-master", "/admin/tenants/reload"]


@pytest.mark.parametrize("path", OPS)
def test_non_operator_forbidden_and_nothing_changes(tmp_path, path: str) -> None:
    h = Harness(tmp_path)
    salt, kid = h.ring.cache_salt("acme"), h.ring.current("acme").kid
    r = h.client.post(path, headers={"x-test-spiffe-id": "spiffe://td/ns/acme/app"})
    assert r.status_code == 403
    assert h.client.post(path).status_code == 401
    assert h.records == []
    assert h.ring.cache_salt("acme") == salt and h.ring.current("acme").kid == kid
    assert h.ring.master_generation == 1


def test_rotate_key_success(tmp_path) -> None:
    h = Harness(tmp_path)
    old_kid = h.ring.current("acme").kid
    r = h.client.post("/admin/tenants/acme/rotate-key", headers={"x-test-spiffe-id": OPERATOR})
    assert r.status_code == 200
    body = r.json()
    assert body["action"] == "tenant.rotate_key" and body["tenant_id"] == "acme"
    assert body["key_version"] == 2 and body["previous_kid"] == old_kid
    assert body["kid"] == h.ring.current("acme").kid != old_kid
    assert body["actor"] == OPERATOR
    assert h.records == [body]
    h.assert_no_secrets(r.text)


def test_rotate_salt_success(tmp_path) -> None:
    h = Harness(tmp_path)
    before = h.ring.cache_salt("acme")
    r = h.client.post("/admin/tenants/acme/rotate-salt", headers={"x-test-spiffe-id": OPERATOR})
    assert r.status_code == 200 and r.json()["salt_epoch"] == 1
    assert h.ring.cache_salt("acme") != before
    assert before not in r.text
    h.assert_no_secrets(r.text)


def test_rotate_unknown_or_malformed_tenant(tmp_path) -> None:
    h = Harness(tmp_path)
    r = h.client.post("/admin/tenants/nobody/rotate-key", headers={"x-test-spiffe-id": OPERATOR})
    assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_tenant"
    r = h.client.post("/admin/tenants/bad:id/rotate-salt", headers={"x-test-spiffe-id": OPERATOR})
    assert r.status_code == 400
    assert h.records == []


def test_rotate_master_reads_configured_source_not_body(tmp_path) -> None:
    h = Harness(tmp_path)
    old = h.ring.current("acme")
    r = h.client.post(
        "/admin/keys/rotate-master",
        headers={"x-test-spiffe-id": OPERATOR},
        content=b"attacker-chosen-secret-0123456789abcdefgh",
    )
    assert r.status_code == 200 and r.json()["master_generation"] == 2
    assert h.ring.current("acme").key == KeyRing(NEW_MASTER).current("acme").key
    assert [k.kid for k in h.ring.lookup_keys("acme")][1] == old.kid  # grace
    h.assert_no_secrets(r.text)
    # Same secret again: conflict, nothing recorded.
    r = h.client.post("/admin/keys/rotate-master", headers={"x-test-spiffe-id": OPERATOR})
    assert r.status_code == 409
    assert len(h.records) == 1


def test_rotate_master_unsafe_file_is_500_without_secret(tmp_path) -> None:
    h = Harness(tmp_path)
    os.chmod(h.master_path, 0o644)
    r = h.client.post("/admin/keys/rotate-master", headers={"x-test-spiffe-id": OPERATOR})
    assert r.status_code == 500 and "group/others" in r.json()["error"]["message"]
    h.assert_no_secrets(r.text)
    assert h.ring.master_generation == 1 and h.records == []


def test_rotate_master_without_source(tmp_path) -> None:
    h = Harness(tmp_path, master_file=False)
    r = h.client.post("/admin/keys/rotate-master", headers={"x-test-spiffe-id": OPERATOR})
    assert r.status_code == 501


def test_reload_success_and_bad_config(tmp_path) -> None:
    h = Harness(tmp_path)
    h.config = CONFIG + [{"id": "gamma", "spiffe_ids": ["spiffe://td/ns/gamma/"]}]
    r = h.client.post("/admin/tenants/reload", headers={"x-test-spiffe-id": OPERATOR})
    assert r.status_code == 200
    assert r.json()["tenant_ids"] == ["acme", "beta", "gamma"]
    assert h.registry.resolve("spiffe://td/ns/gamma/x").id == "gamma"
    h.config = CONFIG + [{"id": "delta", "spiffe_ids": ["spiffe://td/ns/acme/x"]}]  # overlaps acme
    r = h.client.post("/admin/tenants/reload", headers={"x-test-spiffe-id": OPERATOR})
    assert r.status_code == 400 and "overlaps" in r.json()["error"]["message"]
    assert h.registry.get("gamma") is not None  # old registry kept
    assert [rec["action"] for rec in h.records] == ["tenants.reload"]


def test_cli_functions_return_records_without_key_material() -> None:
    ring = KeyRing(MASTER)
    rec = rotate_tenant_key(ring, "acme")
    assert rec["key_version"] == 2 and "key" not in rec
    assert all(ring.current("acme").key.hex() not in str(v) for v in rec.values())
    rec = rotate_tenant_salt(ring, "acme")
    assert rec == {"action": "tenant.rotate_salt", "ts": rec["ts"], "tenant_id": "acme", "salt_epoch": 1}
