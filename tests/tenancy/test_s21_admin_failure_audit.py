"""Session 21, S21-newcomer-3: a failed change request of an authorized operator on the tenancy
admin routes hands exactly one failure record to ``on_failure`` (actor, action, target, status,
error code; the message only where it is fixed text); a success still hands its change record,
unchanged, to ``on_change`` and nothing to ``on_failure``.

Before the fix ``admin_routes`` had no ``on_failure`` and a failure reached no audit.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.testclient import TestClient

from tenancy.admin import admin_routes
from tenancy.keys import KeyRing, KeyRingError, load_master_secret
from tenancy.registry import TenantConfigError, TenantRegistry

MASTER = b"s21-failure-audit-master-secret-0123456789"
NEW_MASTER = b"s21-failure-audit-NEW-master-secret-01234"
OPERATOR = "spiffe://td/ops/alice"
CONFIG = [{"id": "acme", "spiffe_ids": ["spiffe://td/ns/acme/"]}]
#: text a failing config or key-ring error carries that must never reach a record
SECRET_TEXT = "CONFIG-CONTENT-do-not-audit"
FAILURE_KEYS = {"action", "outcome", "route", "actor", "status", "error_code", "ts"}


async def authorize(request: Request) -> dict[str, str]:
    who = request.headers.get("x-test-spiffe-id")
    if who is None:
        raise HTTPException(401, "no identity")
    if who != OPERATOR:
        raise HTTPException(403, "not an operator")
    return {"spiffe_id": who}


class Harness:
    def __init__(self, tmp_path: Path, *, master: bytes | None = NEW_MASTER, loader_error: Exception | None = None,
                 master_error: Exception | None = None) -> None:
        self.ring = KeyRing(MASTER, grace_s=60, state_path=str(tmp_path / "state.json"))
        self.registry = TenantRegistry.from_config(CONFIG)
        self.changes: list[dict] = []
        self.failures: list[dict] = []
        path = tmp_path / "master"
        if master is not None:
            path.write_bytes(master)
            os.chmod(path, 0o600)

        def registry_loader() -> TenantRegistry:
            if loader_error is not None:
                raise loader_error
            return self.registry.reload(CONFIG)

        def master_loader() -> bytes:
            if master_error is not None:
                raise master_error
            return load_master_secret(str(path), None)

        async def on_failure(record: dict) -> None:  # async, like the gateway's on_change
            self.failures.append(record)

        routes = admin_routes(self.ring, registry_loader, authorize,
                              master_loader=master_loader if master is not None else None,
                              on_change=self.changes.append, registry=self.registry, on_failure=on_failure)
        self.client = TestClient(Starlette(routes=routes), raise_server_exceptions=False)

    def post(self, path: str, who: str | None = OPERATOR) -> Any:
        return self.client.post(path, headers={"x-test-spiffe-id": who} if who else {})


# (harness kwargs, path, status, code, action, tenant_id recorded, message recorded)
CASES = [
    ({}, "/admin/tenants/-bad/rotate-key", 400, "invalid_tenant_id", "tenant.rotate_key", None, True),
    ({}, "/admin/tenants/nope/rotate-salt", 404, "unknown_tenant", "tenant.rotate_salt", "nope", True),
    ({"master": MASTER}, "/admin/keys/rotate-master", 409, "master_unchanged", "keys.rotate_master", None, True),
    ({"master": None}, "/admin/keys/rotate-master", 501, "no_master_source", "keys.rotate_master", None, True),
    ({"loader_error": TenantConfigError(f"tenants[0]: {SECRET_TEXT}")}, "/admin/tenants/reload", 400,
     "invalid_config", "tenants.reload", None, False),
    ({"loader_error": ValueError(f"gateway.yaml: {SECRET_TEXT}")}, "/admin/tenants/reload", 400,
     "invalid_config", "tenants.reload", None, False),
    ({"master_error": KeyRingError(f"/etc/{SECRET_TEXT}: unusable")}, "/admin/keys/rotate-master", 500,
     "key_ring_error", "keys.rotate_master", None, False),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[2]}-{c[3]}" for c in CASES])
def test_each_failing_route_class_gives_one_failure_record(tmp_path: Path, case: Any) -> None:
    kwargs, path, status, code, action, tenant_id, with_message = case
    h = Harness(tmp_path, **kwargs)
    r = h.post(path)
    assert r.status_code == status and r.json()["error"]["code"] == code, r.text
    assert h.changes == []
    assert len(h.failures) == 1, h.failures
    rec = h.failures[0]
    assert rec["outcome"] == "failed" and rec["action"] == action and rec["actor"] == OPERATOR
    assert rec["status"] == status and rec["error_code"] == code
    assert rec["route"].startswith("/admin/") and "-bad" not in rec["route"]  # the template, not the raw path
    assert rec.get("tenant_id") == tenant_id
    assert ("message" in rec) is with_message
    if with_message:
        assert rec["message"] == r.json()["error"]["message"]
    assert set(rec) == FAILURE_KEYS | ({"tenant_id"} if tenant_id else set()) | ({"message"} if with_message else set())
    text = repr(rec)
    for secret in (SECRET_TEXT, MASTER.decode(), NEW_MASTER.decode()):
        assert secret not in text


def test_an_unexpected_error_is_recorded_as_internal_error_and_still_raised(tmp_path: Path) -> None:
    h = Harness(tmp_path, loader_error=RuntimeError(SECRET_TEXT))
    r = h.post("/admin/tenants/reload")
    assert r.status_code == 500
    assert [(f["error_code"], f["status"], "message" in f) for f in h.failures] == [("internal_error", 500, False)]
    assert SECRET_TEXT not in repr(h.failures)


@pytest.mark.parametrize("who", [None, "spiffe://td/ns/acme/app"])
def test_a_refused_caller_gives_no_failure_record(tmp_path: Path, who: str | None) -> None:
    """401/403 come from ``authorize``, which audits them itself (the gateway's admin gate)."""
    h = Harness(tmp_path)
    assert h.post("/admin/tenants/acme/rotate-key", who=who).status_code in (401, 403)
    assert h.failures == [] and h.changes == []


@pytest.mark.parametrize("path, keys", [
    ("/admin/tenants/acme/rotate-key", {"action", "ts", "tenant_id", "key_version", "kid", "previous_kid", "grace_s",
                                        "actor"}),
    ("/admin/tenants/acme/rotate-salt", {"action", "ts", "tenant_id", "salt_epoch", "actor"}),
    ("/admin/keys/rotate-master", {"action", "ts", "master_generation", "grace_s", "actor"}),
    ("/admin/tenants/reload", {"action", "ts", "tenants", "tenant_ids", "actor"}),
])
def test_a_success_gives_its_change_record_unchanged(tmp_path: Path, path: str, keys: set[str]) -> None:
    h = Harness(tmp_path)
    r = h.post(path)
    assert r.status_code == 200, r.text
    assert h.failures == []
    assert len(h.changes) == 1 and set(h.changes[0]) == keys and "outcome" not in h.changes[0]
    assert h.changes[0] == r.json()
