"""Session 22, fixsec (S21-fixaudit-1): a failed operator change (``kind=operator``, outcome ``failed``;
S21-newcomer-3) carried no ``client_address``: the tenancy and policy admin routes handed the failure
record to the gateway's callback without the request, so the event said who failed but not from where,
while every refusal of the same operator (the admin gate's 401/403/415, an unrouted 404/405) names its
source. Now the gateway's ``authorize`` hands the request's source (``Authenticator.source``: the peer, or
the client a trusted proxy attests) with the operator's identity, the routes put it in the failure record,
and the event's ``client_address`` (CEF ``src``, the flood key's source) holds it; it is not repeated in
the ``operator`` map."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from audit.cef import format_cef
from audit.summary import SummaryAggregator
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.policy_store import policy_store_section


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    return {"policy": policy_store_section(tmp_path)}


def _failed(log: ListLog) -> list[Any]:
    return [e for e in log.events if e.kind.value == "operator" and e.outcome.value == "failed"]


@pytest.mark.parametrize("method,path,status", [
    ("POST", "/admin/tenants/nope/rotate-salt", 404),  # tenancy/admin.py
    ("DELETE", "/admin/policies/nope.rego", 404),  # policy/admin.py
])
async def test_a_failed_operator_change_names_its_source(stack: Any, audit_log: ListLog, method: str, path: str,
                                                         status: int) -> None:
    r = await stack.client.request(method, f"{stack.admin_url}{path}", headers=stack.operator_auth())
    assert r.status_code == status, r.text
    [ev] = _failed(audit_log)
    assert ev.client_address == "127.0.0.1"  # before the fix: None
    assert "client_address" not in (ev.operator or {})
    assert "src=127.0.0.1" in format_cef(ev)


async def test_a_flood_of_failures_is_summarised_per_source_and_operator(stack: Any, audit_log: ListLog) -> None:
    for _ in range(12):
        r = await stack.client.post(f"{stack.admin_url}/admin/tenants/nope/rotate-key", headers=stack.operator_auth())
        assert r.status_code == 404
    events = _failed(audit_log)
    agg = SummaryAggregator(window_s=10, first_n=5)
    t0 = events[0].time_ms
    assert sum(agg.offer(dataclasses.replace(e, time_ms=t0 + i)) is not None for i, e in enumerate(events)) == 5
    [summary] = agg.flush(t0 + 60_000)
    assert summary.summary["suppressed"] == 7 and summary.summary["source"] == "127.0.0.1"
    assert summary.identity.spiffe_id == "spiffe://demo.prefixgate.test/ops/admin"
