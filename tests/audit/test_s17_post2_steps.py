"""Session 17 (helper post2, issue 14): fewer calls per audit event in the gateway process, the same
behaviour.

* :meth:`audit.remote.RemoteAuditLog.emit_request_row` queues its frame itself (``_send`` and
  ``_schedule_flush`` inline): the same frame, sequence number, backlog, flush timer and byte-bound
  write; a frame over the hard limit is still dropped and counted; a backlog over its limit still
  turns ``accepting`` off with its alert.
* ``accepting`` checks the oldest event's age inline while accepting.
* ``AuditHub.hand_off`` is the log's ``flush_now`` (one call), and does nothing for a log without it.
* :func:`audit.tracing.start_request_trace` draws the ids as the SDK's ``RandomIdGenerator`` does
  (the same ids from the same random state), and asks the generator when a draw is the invalid 0.
* The concentration monitor's window expiry (:func:`audit.concentration_state.expire`) leaves the
  counts a recount of the window gives.
"""
from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace.sampling import TraceIdRatioBased

import audit.tracing as tracing
from audit.concentration import ConcentrationMonitor
from audit.keys import generate_signing_key
from audit.remote import FLUSH_BYTES, RemoteAuditLog
from bench.audit_worker_feed import _row
from gateway.auditing import AuditHub

pytestmark = pytest.mark.timeout(60)


def _log(tmp: Path, **kw: Any) -> RemoteAuditLog:
    key = tmp / "k"
    if not key.exists():
        generate_signing_key(key)
    return RemoteAuditLog({"jsonl": {"dir": str(tmp / "audit"), "signing_key_file": str(key)},
                           "spill": {"dir": str(tmp / "spill")}}, **kw)


def _frame(seq: int, row: Any, spans: Any = None) -> bytes:
    doc = {"t": "r", "s": seq, "r": row} if spans is None else {"t": "r", "s": seq, "r": row, "x": spans}
    return orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE)


async def test_a_row_is_queued_with_its_sequence_backlog_and_one_timer(tmp_path: Path) -> None:
    log = _log(tmp_path)
    rows = [_row(i) for i in range(3)]
    for i, row in enumerate(rows):
        log.emit_request_row(row, None if i != 1 else (7, 1, 5, None, None))
        assert log._flush_scheduled  # armed by the first event, not re-armed
    want = [_frame(1, rows[0]), _frame(2, rows[1], (7, 1, 5, None, None)), _frame(3, rows[2])]
    assert [(seq, frame) for seq, frame, _ in log._unacked] == list(enumerate(want, 1))
    assert log._out == want
    assert log._backlog == log._out_bytes == sum(map(len, want))
    assert log.accepting and log.dropped == 0
    log.flush_now()  # no worker yet: the frames leave the queue, stay in the backlog for the worker
    assert log._out == [] and log._out_bytes == 0 and len(log._unacked) == 3


async def test_the_byte_bound_writes_at_once(tmp_path: Path) -> None:
    log = _log(tmp_path)
    row = _row(0)
    row[9] = "r" * (FLUSH_BYTES // 3)  # the reason field: a third of the bound per frame
    for _ in range(2):
        log.emit_request_row(row)
    assert len(log._out) == 2
    log.emit_request_row(row)  # past the bound: written (queued frames handed on) before any timer
    assert log._out == [] and log._out_bytes == 0
    assert [seq for seq, _, _ in log._unacked] == [1, 2, 3]


async def test_a_frame_over_the_hard_limit_is_dropped_and_counted(tmp_path: Path) -> None:
    log = _log(tmp_path, max_backlog_bytes=1000, headroom=0.0)  # hard limit: 1000 B + 1 MiB
    big = _row(0)
    big[9] = "r" * (2 << 20)
    log.emit_request_row(big)
    assert log.dropped == 1 and not log._unacked and log._backlog == 0
    log.emit_request_row(_row(1))
    assert [seq for seq, _, _ in log._unacked] == [2]


async def test_a_backlog_over_its_limit_stops_accepting_with_an_alert(tmp_path: Path) -> None:
    log = _log(tmp_path, max_backlog_bytes=2000)
    log.emit_request_row(_row(0))
    assert log.accepting
    while log._backlog < 2000:
        log.emit_request_row(_row(1))
    assert not log._accepting and not log.accepting
    alerts = [orjson.loads(f) for _, f, _ in log._unacked if f.startswith(b'{"t":"e"')]
    assert [a["e"]["alert"]["alert_kind"] for a in alerts] == ["audit_worker_backlog"]
    assert log.dropped == 0


async def test_accepting_sees_the_oldest_events_age(tmp_path: Path) -> None:
    log = _log(tmp_path, max_backlog_age_s=5.0)
    log.emit_request_row(_row(0))
    assert log.accepting
    seq, frame, _ = log._unacked[0]
    log._unacked[0] = (seq, frame, time.monotonic() - 6.0)  # as if sent 6 s ago, never acknowledged
    assert not log.accepting
    alerts = [orjson.loads(f) for _, f, _ in log._unacked if f.startswith(b'{"t":"e"')]
    assert [a["e"]["alert"]["alert_kind"] for a in alerts] == ["audit_worker_stalled"]
    log._ack(log._seq)  # the worker caught up: nothing unacknowledged
    assert log.accepting


async def test_hand_off_is_the_logs_flush_now(tmp_path: Path) -> None:
    log = _log(tmp_path)
    hub = AuditHub(log)
    assert hub.hand_off == log.flush_now
    log.emit_request_row(_row(0))
    hub.hand_off()
    assert log._out == []

    class Inline:
        accepting, dropped = True, 0

        def emit(self, event: Any, exclude: Any = ()) -> None:
            raise AssertionError("not called")

    assert AuditHub(Inline()).hand_off() is None  # type: ignore[arg-type]  # its own schedule: nothing
    assert AuditHub(None).hand_off() is None


@pytest.mark.parametrize("ratio", [1.0, 0.5])
def test_trace_ids_are_the_generators(ratio: float) -> None:
    provider = tracing.setup_tracing(None, sample_ratio=ratio)
    for seed in range(200):
        random.seed(seed)
        ts = tracing.start_request_trace(provider, 1, None)
        random.seed(seed)
        rt = tracing.begin_request_trace(provider, "POST /v1/completions", [], {}, 1)
        assert ts is not None and rt is not None
        assert (ts.trace_id, ts.span_id, ts.flags) == (rt.context.trace_id, rt.context.span_id, rt.context.trace_flags)
    assert isinstance(provider.sampler, TraceIdRatioBased) == (ratio < 1.0)


def test_a_zero_draw_asks_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    provider = tracing.setup_tracing(None)
    draws = iter([0, 0])
    monkeypatch.setattr(tracing, "_getrandbits", lambda bits: next(draws))
    ts = tracing.start_request_trace(provider, 1, None)
    assert ts is not None and ts.trace_id != 0 and ts.span_id != 0


_OBS = st.lists(st.tuples(st.floats(0.0, 3.0), st.sampled_from(["r0", "r1", "r2"]), st.integers(0, 50),
                          st.integers(0, 80), st.integers(0, 30), st.sampled_from([None, "a", "b"])),
                min_size=1, max_size=60)


@settings(max_examples=150, deadline=None)
@given(_OBS)
def test_window_expiry_leaves_the_counts_of_a_recount(steps: list[tuple[float, str, int, int, int, Any]]) -> None:
    mon = ConcentrationMonitor(window_s=1.0, eval_interval_s=1e9)
    mon.EVAL_EVERY = 10**9  # type: ignore[misc]  # counts only: no evaluation
    now = 0.0
    for gap, replica, prefill, prompt, cached, tenant in steps:
        now += gap
        mon.observe("p", replica, prefill, prompt, cached, now, tenant=tenant)
        p = mon._pools["p"]
        window = list(p.window)
        assert all(t > now - 1.0 for t, *_ in window)
        assert {k: v for k, v in p.requests.items() if v} == dict(Counter(o[1] for o in window))
        prefill_by: Counter[str] = Counter()
        t_req: Counter[tuple[str, str | None]] = Counter()
        t_pre: Counter[tuple[str, str | None]] = Counter()
        ten_req: Counter[str | None] = Counter()
        ten_pre: Counter[str | None] = Counter()
        for _, r, pf, _, _, tn in window:
            prefill_by[r] += pf
            t_req[(r, tn)] += 1
            t_pre[(r, tn)] += pf
            ten_req[tn] += 1
            ten_pre[tn] += pf
        assert {k: v for k, v in p.prefill.items() if v} == {k: v for k, v in prefill_by.items() if v}
        assert dict(p.t_requests) == dict(t_req) and dict(p.tenant_requests) == dict(ten_req)
        assert {k: v for k, v in p.t_prefill.items() if v} == {k: v for k, v in t_pre.items() if v}
        assert {k: v for k, v in p.tenant_prefill.items() if v} == {k: v for k, v in ten_pre.items() if v}
        assert all(v >= 0 for v in [*p.t_prefill.values(), *p.tenant_prefill.values()])
        assert set(p.t_prefill) <= set(t_req) and set(p.tenant_prefill) <= set(ten_req)  # nothing expired kept
        assert p.prompt == sum(o[3] for o in window) and p.cached == sum(o[4] for o in window)
