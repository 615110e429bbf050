"""Session 21, S21-newcomer-3: a failed operator change is one ``kind=operator`` event with outcome
``failed``, its HTTP status, error code and route, mapped to OCSF Entity Management with status
Failure (status_id 2, ``status_code``, ``status_detail``) and to CEF/syslog like other failures; a
success record still gives the event it gave before; a flood of failures of one operator is
summarised like refusals (first N, then one ``kind=summary`` event per window).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from audit.cef import format_cef
from audit.event import AuditEvent, Kind, Outcome
from audit.ocsf import ENTITY_MANAGEMENT, to_ocsf
from audit.summary import SummaryAggregator
from gateway.auditing import AuditHub
from tenancy.admin import failure_record
from tests.support.audit_log import ListLog

OPERATOR = "spiffe://td/ops/alice"
ROUTE = "/admin/tenants/{tenant_id}/rotate-key"


def _event(record: dict[str, Any]) -> AuditEvent:
    log = ListLog()
    AuditHub(log).record_operator(record)  # type: ignore[arg-type]
    assert len(log.events) == 1
    return log.events[0]


def _failure() -> dict[str, Any]:
    return failure_record("tenant.rotate_key", ROUTE, OPERATOR, 404, "unknown_tenant", "no tenant 'nope'", "nope")


def test_a_failure_record_is_one_failed_operator_event() -> None:
    ev = _event(_failure())
    assert (ev.kind, ev.outcome) == (Kind.OPERATOR, Outcome.FAILED)
    assert ev.identity.spiffe_id == OPERATOR
    assert (ev.status_code, ev.error_code, ev.endpoint) == (404, "unknown_tenant", ROUTE)
    assert ev.operator is not None
    assert {k: ev.operator[k] for k in ("action", "outcome", "tenant_id", "status", "error_code", "message")} == {
        "action": "tenant.rotate_key", "outcome": "failed", "tenant_id": "nope", "status": 404,
        "error_code": "unknown_tenant", "message": "no tenant 'nope'"}


def test_the_ocsf_mapping_of_a_failure_is_status_failure() -> None:
    doc = to_ocsf(_event(_failure()))
    assert doc["class_uid"] == ENTITY_MANAGEMENT and doc["activity_name"] == "Update"
    assert (doc["status_id"], doc["status"]) == (2, "Failure")  # OCSF: status = the caption of status_id (S23-newcomer-8)
    assert (doc["status_code"], doc["status_detail"]) == ("404", "unknown_tenant")
    assert doc["actor"]["user"]["uid"] == OPERATOR
    assert doc["unmapped"]["prefixgate"]["operator"]["action"] == "tenant.rotate_key"


def test_the_cef_line_of_a_failure_names_the_action_and_outcome() -> None:
    line = format_cef(_event(_failure()))
    assert "|operator:failed|operator failed tenant.rotate_key|" in line
    assert f"suser={OPERATOR}" in line and "cn3Label=statusCode cn3=404" in line and f"request={ROUTE}" in line
    assert "error_code\\=unknown_tenant" in line  # in msg, CEF-escaped


def test_a_success_record_gives_the_event_it_gave_before() -> None:
    record = {"action": "tenant.rotate_key", "ts": 1.0, "tenant_id": "acme", "key_version": 2, "kid": "k2",
              "previous_kid": "k1", "grace_s": 60, "actor": OPERATOR}
    ev = _event(dict(record))
    assert (ev.kind, ev.outcome) == (Kind.OPERATOR, Outcome.SUCCEEDED)
    assert (ev.status_code, ev.error_code, ev.endpoint) == (None, None, None)
    assert dict(ev.operator or {}) == record
    doc = to_ocsf(ev)
    assert doc["status_id"] == 1 and "status_code" not in doc and "status_detail" not in doc


def test_a_flood_of_failures_of_one_operator_is_summarised() -> None:
    agg = SummaryAggregator(window_s=10, first_n=5)
    t0 = 1_800_000_000_000
    passed = []
    for i in range(100):
        ev = dataclasses.replace(_event(_failure()), time_ms=t0 + i)
        if agg.offer(ev) is not None:
            passed.append(ev)
    assert len(passed) == 5
    summaries = agg.flush(t0 + 10_000)
    assert len(summaries) == 1
    s = summaries[0].summary or {}
    assert summaries[0].kind is Kind.SUMMARY and summaries[0].identity.spiffe_id == OPERATOR
    counts = (s["suppressed"], s["count_failed"], s["count_status_404"], s["count_code_unknown_tenant"])
    assert counts == (95, 95, 95, 95)
    assert s["top_endpoint"] == ROUTE


def test_successful_operator_changes_and_failed_requests_are_not_aggregated() -> None:
    agg = SummaryAggregator(window_s=10, first_n=1)
    ok = {"action": "tenant.rotate_salt", "tenant_id": "acme", "salt_epoch": 2, "actor": OPERATOR}
    assert all(agg.offer(_event(dict(ok))) is not None for _ in range(20))
    # an inference request that failed upstream (outcome failed, kind inference) passes as before
    assert all(agg.offer(AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.FAILED)) is not None for _ in range(20))
