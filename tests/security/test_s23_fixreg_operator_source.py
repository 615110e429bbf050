"""Session 23, fixreg: where an operator's change came from, for successes too and in OCSF.

S22-fixsec-2: successful operator events (change records) carried no ``client_address`` (failures did since
session 22, S21-fixaudit-1). Now a tenancy change record takes it from the same ``authorize`` value, and a
policy/data change record from the store's writes (``client_address=``, threaded from the policy admin route;
``record.json`` keeps its format: it is written before the address is set). Before: ``None``.

S22-fixsec-1: the OCSF Entity Management mapping (class 3004) had no ``src_endpoint``, so the address reached
JSONL, CEF and OTLP but not OCSF. 3004 extends OCSF's IAM base event, whose ``src_endpoint`` ("Details about
the source of the IAM activity", recommended) ocsf-emitter's 1.5.0 model holds too; now ``src_endpoint.ip``
(no port is known: the source is an address only). Before: no ``src_endpoint``.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from audit.cef import format_cef
from audit.event import AuditEvent
from audit.ocsf import ENTITY_MANAGEMENT, ocsf_line, to_ocsf, validate_ocsf
from gateway.auditing import AuditHub
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.policy_store import policy_store_section

WORKLOADS = "prefixgate/config/workloads"


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    return {"policy": policy_store_section(tmp_path)}


def _succeeded(log: ListLog) -> list[AuditEvent]:
    return [e for e in log.events if e.kind.value == "operator" and e.outcome.value == "succeeded"]


def _ocsf_source(ev: AuditEvent) -> Any:
    doc = to_ocsf(ev)
    assert doc["class_uid"] == ENTITY_MANAGEMENT
    validate_ocsf(doc)  # ocsf-emitter's 1.5.0 EntityManagement model accepts it
    assert ocsf_line(ev) == orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)
    return doc.get("src_endpoint")


@pytest.mark.parametrize("method,path,body", [
    ("POST", "/admin/tenants/tenant-a/rotate-salt", None),  # tenancy/admin.py
    ("POST", "/admin/tenants/reload", None),
    ("PUT", f"/admin/data/{WORKLOADS}", b'{"denied": []}'),  # policy/admin.py -> the store's change record
])
async def test_a_successful_operator_change_names_its_source(stack: Any, audit_log: ListLog, method: str, path: str,
                                                             body: bytes | None) -> None:
    headers = {**stack.operator_auth(), **({"Content-Type": "application/json"} if body else {})}
    r = await stack.client.request(method, f"{stack.admin_url}{path}", headers=headers, content=body)
    assert r.status_code == 200, r.text
    [ev] = _succeeded(audit_log)
    assert ev.client_address == "127.0.0.1"  # before: None
    assert "client_address" not in (ev.operator or {})
    assert "src=127.0.0.1" in format_cef(ev)
    assert _ocsf_source(ev) == {"ip": "127.0.0.1"}  # before: no src_endpoint (S22-fixsec-1)


async def test_the_policy_history_on_disk_keeps_its_format(stack: Any, audit_log: ListLog, tmp_path: Path) -> None:
    r = await stack.client.put(f"{stack.admin_url}/admin/data/{WORKLOADS}", content=b'{"denied": []}',
                               headers={**stack.operator_auth(), "Content-Type": "application/json"})
    assert r.status_code == 200 and r.json()["result"]["client_address"] == "127.0.0.1"
    [written] = list((tmp_path / "versions").glob("*/record.json"))
    assert "client_address" not in json.loads(written.read_text())


def test_a_failed_operator_event_maps_its_source_to_ocsf_and_none_stays_none() -> None:
    from tenancy.admin import failure_record

    log = ListLog()
    hub = AuditHub(log)  # type: ignore[arg-type]
    hub.record_operator(failure_record("tenant.rotate_key", "/admin/tenants/{tenant_id}/rotate-key",
                                       "spiffe://td/ops/alice", 404, "unknown_tenant", "no tenant 'x'", "x",
                                       "2001:db8::7"))
    hub.record_operator({"action": "policy_change", "who": "cli", "version": 3})  # made without a request
    failed, cli = log.events
    assert _ocsf_source(failed) == {"ip": "2001:db8::7"}
    assert _ocsf_source(cli) is None and cli.client_address is None
