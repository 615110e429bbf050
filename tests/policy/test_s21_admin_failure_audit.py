"""Session 21, S21-newcomer-3: a failed ``PUT``/``DELETE`` of an authorized operator on the policy
admin routes hands exactly one failure record to ``on_failure`` (actor, kind/op, target, status,
error code; the message only where it is fixed text; never the uploaded Rego or data); a failed
read hands none, a success none (its change record is the store's).

Before the fix ``policy.admin.admin_routes`` had no ``on_failure`` and a failure reached no audit.
"""
from __future__ import annotations

from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.testclient import TestClient

from policy.admin import MAX_BODY_BYTES, admin_routes
from policy.decision import PolicyError
from policy.store import (
    ChangeRecord,
    PolicyConflictError,
    PolicyNotFoundError,
    PolicyPersistError,
    PolicyTargetError,
)

OPERATOR = "spiffe://td/ops/alice"
#: a marker inside every upload and every store error: it must never reach a failure record
UPLOAD_SECRET = "UPLOADED-TEXT-do-not-audit"
RECORD = ChangeRecord(version=3, who=OPERATOR, kind="policy", op="put", target="authz.rego", old_sha256=None,
                      new_sha256=None, time=0.0, shared="conflict")


async def authorize(request: Request) -> dict[str, str]:
    who = request.headers.get("x-test-spiffe-id")
    if who is None:
        raise HTTPException(401, "no identity")
    return {"spiffe_id": who}


class FakeStore:
    """Raises ``error`` from every change; reads answer or raise ``PolicyNotFoundError``."""

    version = 0

    def __init__(self, error: Exception | None) -> None:
        self.error = error

    def get_policy(self, module_id: str) -> str:
        raise PolicyNotFoundError(module_id)

    def get_data(self, path: str) -> Any:
        raise PolicyNotFoundError(path)

    def list_policies(self) -> list[Any]:
        return []

    async def _change(self, target: str, who: str) -> ChangeRecord:
        if self.error is not None:
            raise self.error
        return ChangeRecord(version=1, who=who, kind="policy", op="put", target=target, old_sha256=None,
                            new_sha256=None, time=0.0)

    async def put_policy(self, module_id: str, source: str, who: str, *, client_address: str | None = None) -> ChangeRecord:
        return await self._change(module_id, who)

    async def delete_policy(self, module_id: str, who: str, *, client_address: str | None = None) -> ChangeRecord:
        return await self._change(module_id, who)

    async def put_data(self, path: str, value: Any, who: str, *, client_address: str | None = None) -> ChangeRecord:
        return await self._change(path, who)


def _target_error() -> PolicyTargetError:
    err = PolicyTargetError(f"opa answered 400: {UPLOAD_SECRET}")
    err.target_may_hold_change = True
    return err


def harness(error: Exception | None) -> tuple[TestClient, list[dict]]:
    failures: list[dict] = []
    store: Any = FakeStore(error)
    app = Starlette(routes=admin_routes(store, authorize, on_failure=failures.append))
    return TestClient(app, raise_server_exceptions=False), failures


REGO = {"Content-Type": "text/plain"}
JSON = {"Content-Type": "application/json"}
# (store error, method, path, body, headers, status, code, kind, op, target, message recorded)
CASES = [
    (PolicyError(f"1 error: {UPLOAD_SECRET}"), "PUT", "/admin/policies/authz.rego", UPLOAD_SECRET, REGO,
     400, "policy_rejected", "policy", "put", "authz.rego", False),
    (PolicyNotFoundError("gone.rego"), "DELETE", "/admin/policies/gone.rego", None, {},
     404, "resource_not_found", "policy", "delete", "gone.rego", True),
    (ValueError(f"bad id {UPLOAD_SECRET}"), "DELETE", "/admin/policies/authz.rego", None, {},
     400, "invalid_parameter", "policy", "delete", "authz.rego", False),
    (_target_error(), "PUT", "/admin/policies/authz.rego", UPLOAD_SECRET, REGO,
     502, "target_refused", "policy", "put", "authz.rego", False),
    (PolicyConflictError(f"version 3 stored first {UPLOAD_SECRET}", RECORD), "PUT", "/admin/policies/authz.rego",
     UPLOAD_SECRET, REGO, 409, "conflict", "policy", "put", "authz.rego", False),
    (PolicyPersistError(f"/var/{UPLOAD_SECRET}: disk full", target_may_hold_change=False, disk_restored=True),
     "PUT", "/admin/data/prefixgate/config/tiers", '{"a": "%s"}' % UPLOAD_SECRET, JSON,
     500, "policy_not_persisted", "data", "put", "prefixgate/config/tiers", False),
    (None, "PUT", "/admin/data/prefixgate/config/tiers", UPLOAD_SECRET, JSON,  # not JSON
     400, "invalid_parameter", "data", "put", "prefixgate/config/tiers", False),
    (None, "PUT", "/admin/policies/authz.rego", UPLOAD_SECRET, {"Content-Type": "application/json"},
     415, "unsupported_media_type", "policy", "put", "authz.rego", True),
    (None, "PUT", "/admin/policies/authz.rego", "x" * (MAX_BODY_BYTES + 1) + UPLOAD_SECRET, REGO,
     413, "body_too_large", "policy", "put", "authz.rego", True),
    (PolicyNotFoundError("x"), "DELETE", f"/admin/policies/{'a' * 200}.rego", None, {},  # too long to record
     404, "resource_not_found", "policy", "delete", None, True),
    (None, "PUT", "/admin/policies/authz.rego", "package p\n", REGO, 200, None, "policy", "put", None, False),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[5]}-{c[6]}" for c in CASES])
def test_each_failing_change_gives_one_failure_record(case: Any) -> None:
    error, method, path, body, headers, status, code, kind, op, target, with_message = case
    client, failures = harness(error)
    r = client.request(method, path, content=body, headers={"x-test-spiffe-id": OPERATOR, **headers})
    assert r.status_code == status, r.text
    if status == 200:  # the fake store accepts anything: a success gives no failure record
        assert failures == []
        return
    assert r.json()["error"]["code"] == code
    assert len(failures) == 1, failures
    rec = failures[0]
    assert rec["outcome"] == "failed" and rec["action"] == "policy_change" and rec["actor"] == OPERATOR
    assert (rec["kind"], rec["op"], rec["status"], rec["error_code"]) == (kind, op, status, code)
    assert rec["route"] in ("/admin/policies/{id}", "/admin/data/{path}")
    assert rec.get("target") == target
    assert ("message" in rec) is with_message
    if with_message:
        assert rec["message"] == r.json()["error"]["message"]
    assert UPLOAD_SECRET not in repr(rec)


def test_a_malformed_target_is_left_out() -> None:
    client, failures = harness(PolicyNotFoundError("x"))
    r = client.delete("/admin/policies/bad%20id%3Bx%00", headers={"x-test-spiffe-id": OPERATOR})
    assert r.status_code == 404
    assert len(failures) == 1 and "target" not in failures[0]


def test_an_unexpected_error_is_recorded_as_internal_error() -> None:
    client, failures = harness(RuntimeError(UPLOAD_SECRET))
    assert client.delete("/admin/policies/authz.rego", headers={"x-test-spiffe-id": OPERATOR}).status_code == 500
    assert [(f["status"], f["error_code"]) for f in failures] == [(500, "internal_error")]
    assert UPLOAD_SECRET not in repr(failures)


@pytest.mark.parametrize("path", ["/admin/policies/nope.rego", "/admin/data/no/such"])
def test_a_failed_read_is_not_recorded(path: str) -> None:
    client, failures = harness(None)
    assert client.get(path, headers={"x-test-spiffe-id": OPERATOR}).status_code == 404
    assert failures == []


def test_an_unauthenticated_change_is_not_recorded_here() -> None:
    client, failures = harness(PolicyNotFoundError("x"))
    assert client.delete("/admin/policies/authz.rego").status_code == 401
    assert failures == []
