"""Issue 12, finding 1: blocked refusals are audited in aggregate.

A source that spent its budget of failed signature checks gets 429
``too_many_unauthenticated`` for every further token that would need a
signature check. Those refusals are never written one by one (an attacker
would otherwise choose the audit volume): each source gets one summary event
per window with the count (``count_too_many_unauthenticated``), and they do
not use up the ``first_n`` individual events other refusals of the source
get. The summary maps to the OCSF Authentication class.
"""

from __future__ import annotations

from audit.event import AuditEvent, Kind, Outcome, PolicyInfo
from audit.ocsf import AUTHENTICATION, to_ocsf, validate_ocsf
from audit.summary import SummaryAggregator

T = 1_900_000_000_000


def blocked(source: str, t: int) -> AuditEvent:
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.RATE_LIMITED, time_ms=t, client_address=source,
                      endpoint="/v1/completions", status_code=429,
                      policy=PolicyInfo(None, "too_many_unauthenticated", None))


def unauthenticated(source: str, t: int) -> AuditEvent:
    return AuditEvent(kind=Kind.AUTH, outcome=Outcome.UNAUTHENTICATED, time_ms=t, client_address=source,
                      endpoint="/v1/completions", status_code=401, policy=PolicyInfo(None, "bad_signature", None))


def test_blocked_refusals_are_one_event_per_source_per_window() -> None:
    agg = SummaryAggregator(window_s=1.0, first_n=5)
    for i in range(300):
        assert agg.offer(blocked("198.51.100.7", T + i)) is None
        assert agg.offer(blocked("198.51.100.8", T + i)) is None
    # the other refusals of that source still get their first_n individual events
    passed = [agg.offer(unauthenticated("198.51.100.7", T + 400 + i)) for i in range(7)]
    assert sum(e is not None for e in passed) == 5
    assert agg.flush(T + 500) == []  # the window is still open
    out = {e.client_address: e for e in agg.flush(T + 1000)}
    assert set(out) == {"198.51.100.7", "198.51.100.8"}
    a, b = out["198.51.100.7"].summary, out["198.51.100.8"].summary
    assert a["count_too_many_unauthenticated"] == 300 and b["count_too_many_unauthenticated"] == 300
    assert a["suppressed"] == 302 and a["count_rate_limited"] == 300 and a["count_unauthenticated"] == 2
    assert b["suppressed"] == 300 and b["emitted_individually"] == 0
    # the next window starts afresh, again as a single summary
    for i in range(10):
        assert agg.offer(blocked("198.51.100.7", T + 2000 + i)) is None
    (again,) = agg.flush(T + 3000)
    assert again.summary["count_too_many_unauthenticated"] == 10


def test_blocked_summary_is_an_ocsf_authentication_event() -> None:
    agg = SummaryAggregator(window_s=1.0, first_n=5)
    for i in range(3):
        agg.offer(blocked("198.51.100.7", T + i))
    (summary,) = agg.flush(T + 1000)
    doc = to_ocsf(summary)
    validate_ocsf(doc)
    assert doc["class_uid"] == AUTHENTICATION and doc["count"] == 3
