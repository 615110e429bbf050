"""Session 27, lead (S26-policy26-3 / S27-review27-4): a policy admin write that changes nothing (200
``unchanged``, session 26) left no audit event, so a SIEM counting admin writes missed it. Now it is one
operator event, outcome ``succeeded``, with ``operator.unchanged`` true and the version that stays in force,
its source address like any operator event, and never the upload. Before: no event."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from audit.event import AuditEvent
from audit.ocsf import to_ocsf, validate_ocsf
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.policy_store import policy_store_section

WORKLOADS = "prefixgate/config/workloads"
EXTRA = "package prefixgate.extra\n\nx := 1\n"


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    return {"policy": policy_store_section(tmp_path)}


def _operator(log: ListLog) -> list[AuditEvent]:
    return [e for e in log.events if e.kind.value == "operator"]


async def test_a_repeated_put_and_roll_back_are_audited_as_unchanged(stack: Any, audit_log: ListLog) -> None:
    auth = stack.operator_auth()
    put = await stack.client.put(f"{stack.admin_url}/admin/policies/extra.rego", content=EXTRA.encode(),
                                 headers={**auth, "Content-Type": "text/plain"})
    assert put.status_code == 200 and "unchanged" not in put.json()
    version = put.json()["result"]["version"]
    again = await stack.client.put(f"{stack.admin_url}/admin/policies/extra.rego", content=EXTRA.encode(),
                                   headers={**auth, "Content-Type": "text/plain"})
    assert again.status_code == 200 and again.json()["unchanged"] is True
    back = await stack.client.post(f"{stack.admin_url}/admin/policies/rollback", json={"to": version},
                                   headers=auth)
    assert back.status_code == 200 and back.json()["unchanged"] is True
    events = _operator(audit_log)
    assert len(events) == 3  # before: 1 (the real change only)
    changed, put_same, rollback_same = events
    assert "unchanged" not in (changed.operator or {})
    for ev in (put_same, rollback_same):
        assert ev.outcome.value == "succeeded" and ev.client_address == "127.0.0.1"
        op = ev.operator or {}
        assert op["unchanged"] is True and op["version"] == version and op["action"] == "policy_change"
        assert "status" not in op and "error_code" not in op
        assert not any(EXTRA.strip() in str(v) for v in op.values())  # never the upload
        validate_ocsf(to_ocsf(ev))
    assert (put_same.operator or {})["kind"] == "policy" and (put_same.operator or {})["target"] == "extra.rego"
    assert (rollback_same.operator or {})["op"] == "rollback" and (rollback_same.operator or {})["rollback_to"] == version


async def test_a_data_put_of_the_document_in_force_is_audited_once(stack: Any, audit_log: ListLog) -> None:
    auth = {**stack.operator_auth(), "Content-Type": "application/json"}
    first = await stack.client.put(f"{stack.admin_url}/admin/data/{WORKLOADS}", content=b'{"denied": []}',
                                   headers=auth)
    assert first.status_code == 200
    second = await stack.client.put(f"{stack.admin_url}/admin/data/{WORKLOADS}", content=b'{"denied": []}',
                                    headers=auth)
    assert second.json()["unchanged"] is True
    [_, ev] = _operator(audit_log)
    assert (ev.operator or {})["kind"] == "data" and (ev.operator or {})["unchanged"] is True
    assert (ev.operator or {})["target"] == WORKLOADS
