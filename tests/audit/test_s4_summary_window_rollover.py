"""A flood window that ended but was not flushed yet is not lost when the next event of its
source opens a new window: its count reaches the next flush. (Under CPU load the periodic
flusher of :class:`audit.log.AuditLog` can run after the next event; before this fix the
closed window was replaced and its suppressed events vanished from the audit trail.)"""

from __future__ import annotations

from audit.event import AuditEvent, Kind, Outcome, PolicyInfo
from audit.summary import SummaryAggregator


def refused(t: int, code: str = "in_flight_limited", source: str = "10.0.0.9") -> AuditEvent:
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.RATE_LIMITED, time_ms=t, client_address=source,
                      status_code=429, policy=PolicyInfo(None, code, None))


def test_a_closed_unflushed_window_is_summarized_after_the_next_window_opens() -> None:
    agg = SummaryAggregator(window_s=1, first_n=2)
    t0 = 1_000_000
    passed = sum(agg.offer(refused(t0 + i)) is not None for i in range(10))  # 2 passed, 8 counted
    # the window [t0, t0+1000) ended; the flusher has not run; the source's next events arrive
    passed += sum(agg.offer(refused(t0 + 1500 + i)) is not None for i in range(5))  # 2 passed, 3 counted
    assert passed == 4
    first = agg.flush(t0 + 1600)  # only the first window has ended by now
    assert [e.summary["suppressed"] for e in first] == [8]
    assert first[0].summary["window_start"] < (agg.flush(t0 + 10_000)[0].summary["window_start"])


def test_every_counted_event_reaches_a_summary_when_flushes_are_late() -> None:
    agg = SummaryAggregator(window_s=1, first_n=2)
    t0, n = 2_000_000, 30
    passed = sum(agg.offer(refused(t0 + 150 * i)) is not None for i in range(n))  # 4.5 s, no flush between
    summaries = agg.flush(t0 + 60_000)
    assert passed + sum(e.summary["count_rate_limited"] for e in summaries) == n


def test_summary_only_codes_of_a_closed_window_are_kept_too() -> None:
    agg = SummaryAggregator(window_s=1, first_n=2)
    t0 = 3_000_000
    for i in range(4):
        assert agg.offer(refused(t0 + i, code="too_many_unauthenticated")) is None
    assert agg.offer(refused(t0 + 2000, code="too_many_unauthenticated")) is None
    counts = [e.summary.get("count_too_many_unauthenticated") for e in agg.flush(t0 + 60_000)]
    assert sorted(counts) == [1, 4]
