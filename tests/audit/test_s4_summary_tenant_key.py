"""R4-3: the flood aggregation keys authenticated refusals by (source, tenant, identity), so one
tenant's refusals from a shared address (NAT, shared node) never decide whether another tenant's
events are written; every summary names its tenant ("unauthenticated" when none), its SPIFFE ID
(when one) and counts per status and reason code. The number of keys stays bounded."""

from __future__ import annotations

from audit.event import AuditEvent, Identity, Kind, Outcome, PolicyInfo
from audit.summary import SummaryAggregator

NAT = "203.0.113.7"
TD = "demo.prefixgate.test"


def refused(t: int, tenant: str | None, status: int = 400, code: str = "invalid_request",
            outcome: Outcome = Outcome.REJECTED, source: str = NAT) -> AuditEvent:
    ident = Identity(f"spiffe://{TD}/{tenant}/app", TD) if tenant else Identity()
    return AuditEvent(kind=Kind.INFERENCE, outcome=outcome, time_ms=t, client_address=source, tenant=tenant,
                      identity=ident, status_code=status, error_code=code, policy=PolicyInfo(None, code, None))


def test_other_tenants_first_refusals_pass_individually_from_a_shared_address() -> None:
    agg = SummaryAggregator(window_s=10, first_n=5)
    t0 = 1_000_000
    passed_a = sum(agg.offer(refused(t0 + i, "acme")) is not None for i in range(6))
    assert passed_a == 5
    assert agg.offer(refused(t0 + 10, "globex", status=404, code="model_not_found")) is not None
    # unauthenticated refusals from the same address have their own budget too
    assert agg.offer(refused(t0 + 11, None, status=401, code="missing_token",
                             outcome=Outcome.UNAUTHENTICATED)) is not None


def test_summary_names_tenant_identity_and_counts_per_status_and_code() -> None:
    agg = SummaryAggregator(window_s=10, first_n=1)
    t0 = 2_000_000
    agg.offer(refused(t0, "acme"))
    agg.offer(refused(t0 + 1, "acme", status=400, code="invalid_request"))
    agg.offer(refused(t0 + 2, "acme", status=404, code="model_not_found"))
    agg.offer(refused(t0 + 3, "acme", status=429, code="rate_limited", outcome=Outcome.RATE_LIMITED))
    for i in range(3):
        agg.offer(refused(t0 + 4 + i, None, status=401, code="missing_token", outcome=Outcome.UNAUTHENTICATED))
    by_tenant = {e.summary["tenant"]: e for e in agg.flush(t0 + 60_000)}
    assert set(by_tenant) == {"acme", "unauthenticated"}
    acme = by_tenant["acme"]
    assert acme.tenant == "acme"
    assert acme.identity.spiffe_id == f"spiffe://{TD}/acme/app"
    assert acme.summary["spiffe_id"] == f"spiffe://{TD}/acme/app"
    assert acme.summary["source"] == NAT and acme.client_address == NAT
    assert acme.summary["suppressed"] == 3
    assert acme.summary["count_status_400"] == 1
    assert acme.summary["count_status_404"] == 1
    assert acme.summary["count_status_429"] == 1
    assert acme.summary["count_code_invalid_request"] == 1
    assert acme.summary["count_code_model_not_found"] == 1
    assert acme.summary["count_code_rate_limited"] == 1
    anon = by_tenant["unauthenticated"]
    assert anon.tenant is None and anon.identity.spiffe_id is None
    assert anon.summary["count_status_401"] == 2
    assert anon.summary["count_code_missing_token"] == 2


def test_keys_stay_bounded_under_many_sources() -> None:
    agg = SummaryAggregator(window_s=10, first_n=0, max_sources=50)
    t0 = 3_000_000
    for i in range(2000):
        agg.offer(refused(t0 + i % 100, "acme" if i % 2 else None, source=f"2001:db8::{i:x}"))
    assert agg.open_windows <= 50 + 2  # max_sources, plus one overflow bucket per tenant and one unauthenticated
    summaries = agg.flush(t0 + 60_000)
    assert sum(e.summary["suppressed"] for e in summaries) == 2000
    overflow = [e for e in summaries if e.summary["source"] == "*other*"]
    assert {e.summary["tenant"] for e in overflow} == {"acme", "unauthenticated"}
