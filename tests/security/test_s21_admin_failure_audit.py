"""Session 21, S21-newcomer-3, end to end: every failed change request of an admitted operator on
the admin listener (tenancy: 400 bad id, 404 unknown tenant, 409 unchanged master, 400 broken
config on reload, 500 key-ring error; policy: 400 rejected upload, 404 delete, 413, 415; data: 400)
is one ``kind=operator`` ``outcome=failed`` event in the signed, chained JSONL trail and in the OCSF
sink (status Failure), with the operator's SPIFFE ID, action, target, HTTP status and error code and
no uploaded text, config content or key material; a success is still its change record; the chain
verifies.

Before the fix none of these failures left an audit event (only successes did).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx
import pytest

from audit.keys import load_public_key
from audit.verify import verify_files
from gateway.auditing import AuditHub
from tests.gateway.test_audit_e2e import _events  # the JSONL chain's event bodies
from tests.support.audit_log import file_audit_hub
from tests.support.policy_store import policy_store_section

OPERATOR = "spiffe://demo.prefixgate.test/ops/admin"
MARKER = "UPLOADMARKERzebra"  # inside every upload and the broken config: never in any audit output


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    return {"policy": policy_store_section(tmp_path)}


@pytest.fixture
def audit_hub(tmp_path: Path) -> AuditHub:
    # first_n above the test's count: this test is about the events, the flood test about summaries
    return file_audit_hub(tmp_path, ocsf={"file": str(tmp_path / "ocsf.jsonl")},
                          summary={"window_s": 60, "first_n": 100})


async def test_failed_operator_changes_are_audited_once_each(stack: Any, tmp_path: Path) -> None:
    auth = stack.operator_auth()
    cfg_file = tmp_path / "gateway.yaml"
    good_cfg = cfg_file.read_text()
    master = tmp_path / "master.key"
    rego = "package prefixgate.authz\n# " + MARKER + "\ndecision := {"
    cases: list[tuple[str, str, Any, dict[str, str], int, str, str, str | None]] = [
        ("POST", "/admin/tenants/-bad/rotate-key", None, {}, 400, "invalid_tenant_id", "tenant.rotate_key", None),
        ("POST", "/admin/tenants/nope/rotate-salt", None, {}, 404, "unknown_tenant", "tenant.rotate_salt", "nope"),
        ("POST", "/admin/keys/rotate-master", None, {}, 409, "master_unchanged", "keys.rotate_master", None),
        ("POST", "/admin/tenants/reload", "broken", {}, 400, "invalid_config", "tenants.reload", None),
        ("POST", "/admin/keys/rotate-master", "chmod", {}, 500, "key_ring_error", "keys.rotate_master", None),
        ("PUT", "/admin/policies/authz.rego", rego, {"Content-Type": "text/plain"}, 400, "policy_rejected",
         "policy_change", "authz.rego"),
        ("DELETE", "/admin/policies/nope.rego", None, {}, 404, "resource_not_found", "policy_change", "nope.rego"),
        ("PUT", "/admin/policies/authz.rego", MARKER, {"Content-Type": "application/json"}, 415,
         "unsupported_media_type", "policy_change", "authz.rego"),
        ("PUT", "/admin/policies/authz.rego", MARKER * 70_000, {"Content-Type": "text/plain"}, 413,
         "body_too_large", "policy_change", "authz.rego"),
        ("PUT", "/admin/data/prefixgate/config/tiers", f'["{MARKER}"]', {"Content-Type": "application/json"}, 400,
         "invalid_parameter", "policy_change", "prefixgate/config/tiers"),
    ]
    async with httpx.AsyncClient(base_url=stack.admin_url, timeout=30) as admin:
        for method, path, body, headers, status, code, _, _ in cases:
            if body == "broken":
                cfg_file.write_text(f"tenancy: {{tenants: [{{id: '{MARKER}', spiffe_ids: 7}}]}}\n")
                body = None
            elif body == "chmod":
                os.chmod(master, 0o644)  # an unusable master secret file: KeyRingError
                body = None
            try:
                r = await admin.request(method, path, content=body, headers={**auth, **headers})
            finally:
                cfg_file.write_text(good_cfg)
                os.chmod(master, 0o600)
            assert (r.status_code, r.json()["error"]["code"]) == (status, code), (path, r.text)
        ok = await admin.post("/admin/tenants/tenant-a/rotate-key", headers=auth)
        assert ok.status_code == 200, ok.text
    await stack.components.audit.log.drain()
    operator = [e for e in _events(tmp_path) if e["kind"] == "operator"]
    failed = [e for e in operator if e["outcome"] == "failed"]
    assert len(failed) == len(cases)  # exactly one per failed request, in order
    for ev, (_, _, _, _, status, code, action, target) in zip(failed, cases):
        details = ev["operator"]
        assert ev["identity"]["spiffe_id"] == OPERATOR and details["actor"] == OPERATOR
        assert (ev["status_code"], ev["error_code"], details["action"]) == (status, code, action)
        assert details.get("tenant_id", details.get("target")) == target
        assert ev["endpoint"] == details["route"] and details["route"].startswith("/admin/")  # a template
        assert "-bad" not in ev["endpoint"] and "nope" not in ev["endpoint"]
    succeeded = [e for e in operator if e["outcome"] == "succeeded"]
    assert [e["operator"]["action"] for e in succeeded] == ["tenant.rotate_key"]
    assert "status_code" not in succeeded[0] and "error_code" not in succeeded[0]
    # OCSF: status Failure with the HTTP status and the error code
    ocsf = {}
    for line in (tmp_path / "ocsf.jsonl").read_text().splitlines():
        doc = json.loads(line)
        ocsf[doc["metadata"]["uid"]] = doc
    for ev in failed:
        doc = ocsf[ev["event_id"]]
        assert (doc["class_uid"], doc["status_id"]) == (3004, 2)
        assert (doc["status_code"], doc["status_detail"]) == (str(ev["status_code"]), ev["error_code"])
    assert ocsf[succeeded[0]["event_id"]]["status_id"] == 1
    # the chain verifies; no upload, config content or master secret in any output
    await stack.components.audit.log.close()
    report = verify_files([tmp_path / "audit"], load_public_key(tmp_path / "keys" / "audit.key.pub"))
    assert report.ok, report.problems
    stack.components.audit.log = None  # closed: the fixture's stop() must not close it twice
    outputs = [tmp_path / "ocsf.jsonl", *sorted((tmp_path / "audit").glob("*")),
               *sorted((tmp_path / "spill").glob("*"))]
    blob = "".join(p.read_text(errors="replace") for p in outputs if p.is_file())
    assert MARKER not in blob and master.read_text().strip() not in blob
