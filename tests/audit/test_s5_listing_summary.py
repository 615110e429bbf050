"""R5-4: successful ``GET /v1/models`` events are flood-aggregated like refusals (the first
``first_n`` per (source, tenant, identity) and window pass, the rest are counted into the key's
summary), while allowed inference events always pass individually."""

from __future__ import annotations

from audit.event import AuditEvent, Identity, Kind, Outcome
from audit.summary import SummaryAggregator

TD = "demo.prefixgate.test"
SRC = "198.51.100.4"


def allowed(t: int, endpoint: str) -> AuditEvent:
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, time_ms=t, client_address=SRC, tenant="acme",
                      identity=Identity(f"spiffe://{TD}/acme/app", TD), status_code=200, endpoint=endpoint)


def test_listings_beyond_first_n_are_summarised() -> None:
    agg = SummaryAggregator(window_s=10, first_n=3)
    t0 = 5_000_000
    passed = sum(agg.offer(allowed(t0 + i, "/v1/models")) is not None for i in range(10))
    assert passed == 3
    (summary,) = agg.flush(t0 + 60_000)
    assert summary.tenant == "acme"
    assert summary.summary["suppressed"] == 7
    assert summary.summary["count_allowed"] == 7
    assert summary.summary["count_status_200"] == 7
    assert summary.summary["top_endpoint"] == "/v1/models"


def test_allowed_inference_events_always_pass() -> None:
    agg = SummaryAggregator(window_s=10, first_n=3)
    t0 = 6_000_000
    for endpoint in ("/v1/chat/completions", "/v1/completions"):
        assert all(agg.offer(allowed(t0 + i, endpoint)) is not None for i in range(10))
    assert agg.flush(t0 + 60_000) == []
