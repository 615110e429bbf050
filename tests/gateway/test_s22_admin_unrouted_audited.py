"""Session 22, fixsec (S21-fixaudit-2): on the admin listener a wrong method on an admin route (``PATCH
/admin/tenants/{id}/rotate-key``, ``POST /admin/metrics``) or an unknown admin path, asked by an admitted
operator, was answered 405 / 404 by Starlette's router with no audit event, while the admin gate's 401 / 403
/ 415 are refusals of endpoint ``admin``. Now such a 404 / 405 is one refusal event of the same shape as the
gate's 415 of an operator (endpoint ``admin``, outcome ``rejected``, the operator's identity, the event's
``X-Request-Id`` on the answer; the path is client-chosen and never logged), and a flood of them is
summarised like the gate's other refusals. The public listener's 404 / 405 are audited as before."""

from __future__ import annotations

from typing import Any

import pytest

from audit.event import AuditEvent
from audit.summary import SummaryAggregator
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

TD = "demo.prefixgate.test"
OPERATOR = f"spiffe://{TD}/ops/admin"


def _event_of(log: ListLog, r: Any) -> AuditEvent:
    rid = r.headers.get("x-request-id")
    assert rid, "admin 404/405 answered without X-Request-Id: not audited"
    found = [e for e in log.events if getattr(e, "request_id", None) == rid]
    assert len(found) == 1
    return found[0]


@pytest.mark.parametrize("method,path,status", [
    ("PATCH", "/admin/tenants/tenant-a/rotate-key", 405), ("POST", "/admin/metrics", 405),
    ("DELETE", "/admin/tenants/reload", 405), ("PUT", "/admin/keys/rotate-master", 405),
    ("GET", "/admin/no-such-thing", 404), ("POST", "/admin/metrics/", 404),
])
async def test_an_operators_unrouted_admin_request_is_an_audited_refusal(
        stack: Any, audit_log: ListLog, method: str, path: str, status: int) -> None:
    before = len(audit_log.events)
    r = await stack.client.request(method, f"{stack.admin_url}{path}", headers=stack.operator_auth())
    assert r.status_code == status
    ev = _event_of(audit_log, r)
    assert len(audit_log.events) == before + 1
    assert (ev.endpoint, ev.status_code, ev.outcome.value) == ("admin", status, "rejected")
    assert ev.error_code == {404: "not_found", 405: "method_not_allowed"}[status]
    assert ev.identity.spiffe_id == OPERATOR and ev.identity.trust_domain == TD
    assert ev.tenant is None and ev.client_address == "127.0.0.1"
    if status == 405:
        assert "allow" in r.headers  # the router's answer is unchanged


async def test_the_gates_refusal_of_an_operator_has_the_same_shape(stack: Any, audit_log: ListLog) -> None:
    headers = {**stack.operator_auth(), "Content-Encoding": "gzip"}
    r = await stack.client.request("PATCH", f"{stack.admin_url}/admin/metrics", headers=headers)
    assert r.status_code == 415  # the gate's refusal (before routing)
    gate = _event_of(audit_log, r)
    r = await stack.client.request("PATCH", f"{stack.admin_url}/admin/metrics", headers=stack.operator_auth())
    assert r.status_code == 405
    routed = _event_of(audit_log, r)
    shape = ("kind", "endpoint", "outcome", "identity", "tenant", "client_address")
    assert [getattr(gate, k) for k in shape] == [getattr(routed, k) for k in shape]


async def test_a_flood_of_unrouted_admin_requests_is_summarised(stack: Any, audit_log: ListLog) -> None:
    for _ in range(30):
        r = await stack.client.request("PATCH", f"{stack.admin_url}/admin/tenants/reload",
                                       headers=stack.operator_auth())
        assert r.status_code == 405
    events = [e for e in audit_log.events if e.endpoint == "admin"]
    assert len(events) == 30
    agg = SummaryAggregator(window_s=10, first_n=5)  # the audit log's aggregation (audit.summary)
    t0 = events[0].time_ms
    passed = [e for e in events if agg.offer(e) is not None]
    assert len(passed) == 5
    summaries = agg.flush(t0 + 60_000)
    assert len(summaries) == 1 and summaries[0].summary["suppressed"] == 25
    assert summaries[0].summary["count_status_405"] == 25


async def test_public_unrouted_requests_are_audited_as_before(stack: Any, audit_log: ListLog) -> None:
    r = await stack.client.request("PATCH", "/v1/completions", headers=stack.auth("tenant-a/app"))
    assert r.status_code == 405
    ev = _event_of(audit_log, r)
    assert (ev.endpoint, ev.tenant, ev.outcome.value) == ("unrouted", "tenant-a", "rejected")
