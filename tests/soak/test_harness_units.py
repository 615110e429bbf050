"""Pure pieces of the soak harness (bench/soak.py): schedules, statistics, /proc readers."""

from __future__ import annotations

import os
import socket

import pytest

from bench.soak import (
    AuditCheck,
    fd_breakdown,
    linear_slope,
    percentile,
    read_proc,
    trace_schedule,
)
from sim.trace import TraceRequest


def _rows(n: int, gap: float = 2.0) -> list[TraceRequest]:
    return [TraceRequest(i, i * gap, 512, 8, (0, 1000 + i)) for i in range(n)]


def test_trace_schedule_rescales_trace_gaps_to_rate_and_cycles():
    rows = [TraceRequest(0, 0.0, 512, 8, (0, 1)), TraceRequest(1, 1.0, 512, 8, (0, 2)),
            TraceRequest(2, 4.0, 512, 8, (0, 3))]
    tenants = ["a", "b", "c"]
    sched, nxt = trace_schedule(rows, tenants, start=1, rate=2.0, duration_s=3.0)
    assert len(sched) == 6 and nxt == (1 + 6) % 3
    assert [r.index for _, r, _ in sched] == [1, 2, 0, 1, 2, 0]
    assert [t for _, _, t in sched] == ["b", "c", "a", "b", "c", "a"]
    offsets = [o for o, _, _ in sched]
    assert offsets == sorted(offsets) and offsets[0] == 0.0 and offsets[-1] < 3.0
    # the trace's own relative gaps survive (1->2 is 3 trace s, the wrap 2->0 is 0)
    assert offsets[2] == pytest.approx(offsets[1])
    assert offsets[1] - offsets[0] == pytest.approx(3 * (offsets[3] - offsets[2]))  # 3 trace s vs 1


def test_trace_schedule_uniform_when_trace_has_no_gaps():
    rows = [TraceRequest(i, 0.0, 512, 8, (0, i + 1)) for i in range(4)]
    sched, _ = trace_schedule(rows, ["a"] * 4, 0, 4.0, 1.0)
    assert [o for o, _, _ in sched] == pytest.approx([0.0, 0.25, 0.5, 0.75])
    with pytest.raises(ValueError):
        trace_schedule(rows, ["a"] * 4, 0, 0.0, 1.0)
    with pytest.raises(ValueError):
        trace_schedule([], [], 0, 1.0, 1.0)


def test_linear_slope_and_percentile():
    assert linear_slope([0, 1, 2, 3], [5, 7, 9, 11]) == pytest.approx(2.0)
    assert linear_slope([0, 1, 2, 3], [5, 5, 5, 5]) == pytest.approx(0.0)
    assert linear_slope([0, 1], [0, 1]) is None
    assert linear_slope([1, 1, 1], [0, 1, 2]) is None
    vals = list(range(1, 101))
    assert percentile(vals, 50) == 50 and percentile(vals, 99) == 99 and percentile(vals, 100) == 100
    assert percentile([], 50) is None


def test_read_proc_and_fd_breakdown_of_this_process():
    s = read_proc(os.getpid())
    assert s.rss_kib > 1000 and s.fds > 0 and s.cpu_s > 0
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        cli = socket.create_connection(("127.0.0.1", port))
        acc, _ = srv.accept()
        try:
            d = fd_breakdown(os.getpid(), [port], [port])
            # one listener, the accepted connection (local port = listen port), the outgoing one
            assert d["listen"] >= 1 and d["client"] >= 1 and d["upstream"] >= 1
            assert abs(sum(d.values()) - len(os.listdir(f"/proc/{os.getpid()}/fd"))) <= 1  # the listdir fd
        finally:
            cli.close()
            acc.close()


def test_read_proc_of_missing_process_raises():
    with pytest.raises(ProcessLookupError):
        read_proc(2**22 + 12345)


def test_audit_check_counts_lost_records():
    base = dict(duplicates=0, outcomes={}, last_record_type="checkpoint", checkpoints=1, unsealed_records=0,
                verify_exit=0, verify_output="")
    assert AuditCheck(sent=10, answered=10, inference_events=10, missing_request_ids=0, **base).ok
    lost = AuditCheck(sent=10, answered=10, inference_events=9, missing_request_ids=0, **base)
    assert lost.lost == 1 and not lost.ok
    assert AuditCheck(sent=10, answered=10, inference_events=10, missing_request_ids=2, **base).lost == 2
    # a connection that failed before any status: the gateway may or may not have an event for it
    for events in (8, 9):
        c = AuditCheck(sent=9, answered=8, inference_events=events, missing_request_ids=0, **base)
        assert c.unanswered == 1 and c.lost == 0 and c.ok
    assert not AuditCheck(sent=9, answered=8, inference_events=10, missing_request_ids=0, **base).ok
    unsealed = AuditCheck(sent=1, answered=1, inference_events=1, missing_request_ids=0,
                          **{**base, "unsealed_records": 3})
    assert not unsealed.ok
