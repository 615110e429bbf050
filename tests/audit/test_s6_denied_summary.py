"""R6-4: ``denied`` (403) events are aggregated per (source, tenant, SPIFFE ID) like the other
refusals: 2,000 ``not_an_operator`` from one identity are ``first_n`` events plus one summary per
window, each identity keeps its own first events, the table stays bounded, no count is lost."""

from __future__ import annotations

from audit.event import AuditEvent, Identity, Kind, Outcome, PolicyInfo
from audit.summary import OTHER_SOURCE, SummaryAggregator


def _denied(t_ms: int, spiffe: str, code: str = "not_an_operator") -> AuditEvent:
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.DENIED, time_ms=t_ms, client_address="10.0.0.9",
                      identity=Identity(spiffe, "demo.prefixgate.test"), status_code=403,
                      endpoint="/admin/replicas", policy=PolicyInfo(None, code, None))


def test_2000_not_an_operator_from_one_identity_are_first_n_plus_one_summary() -> None:
    agg = SummaryAggregator(window_s=10, first_n=5)
    passed = [e for i in range(2000) if (e := agg.offer(_denied(1_000 + i, "spiffe://d/acme/app"))) is not None]
    assert len(passed) == 5  # before R6-4: 2,000
    (s,) = agg.flush(20_000)
    assert s.kind == Kind.SUMMARY and s.identity.spiffe_id == "spiffe://d/acme/app"
    assert s.summary is not None
    assert s.summary["suppressed"] == 1995 and s.summary["count_denied"] == 1995
    assert s.summary["count_status_403"] == 1995 and s.summary["count_code_not_an_operator"] == 1995


def test_each_identity_keeps_its_first_events_and_the_table_is_bounded() -> None:
    agg = SummaryAggregator(window_s=10, first_n=1, max_sources=50)
    passed = 0
    for i in range(200):  # 200 unmapped workloads, 3 requests each
        for j in range(3):
            passed += agg.offer(_denied(1_000 + i * 3 + j, f"spiffe://d/nobody{i}/app", "unknown_workload")) is not None
    assert agg.open_windows <= 51  # max_sources + the no-tenant overflow key
    assert passed == 50 + 1  # first of each of the 50 keys, then the shared overflow key's first
    summaries = agg.flush(0, force=True)
    assert sum(s.summary["suppressed"] for s in summaries if s.summary) == 600 - passed
    assert any(s.summary and s.summary["source"] == OTHER_SOURCE for s in summaries)
