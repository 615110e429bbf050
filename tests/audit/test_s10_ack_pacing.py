"""Session 10 (issue 14): the audit worker paces its status frames after input.

One status frame per handed-over event cost the gateway a pipe read and an event-loop turn per
request. After input, a frame whose only changes are the acknowledgement and the spill bytes now
waits :data:`audit.worker.ACK_MIN_INTERVAL_S` since the last one; a change of ``accepting`` or
``dropped`` (the gateway's fail-closed gate and its loss counter) is still sent at once, and the
status loop (unpaced) sends what is pending.
"""
from __future__ import annotations

from typing import Any

import pytest

from audit import worker


class _Audit:
    def __init__(self) -> None:
        self.accepting = True
        self.dropped = 0
        self.spill_pending_bytes = 0
        self.emitted_n = 0
        self.durable_n = 0


class _Out:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []

    def send(self, frame: dict[str, Any]) -> None:
        self.frames.append(dict(frame))


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    now = [1000.0]
    monkeypatch.setattr(worker.time, "monotonic", lambda: now[0])
    return now


def _feed(tracker: Any, audit: _Audit, out: _Out, seq: int) -> None:
    audit.emitted_n += 1
    tracker.emitted(seq)
    audit.durable_n = audit.emitted_n  # delivered at once
    tracker.report(out, paced=True)


def test_acks_after_input_are_paced_and_the_loop_sends_the_last(clock: list[float]) -> None:
    audit, out = _Audit(), _Out()
    tracker = worker._AckTracker(audit)
    for seq in range(1, 101):  # 100 events within one interval
        _feed(tracker, audit, out, seq)
        clock[0] += worker.ACK_MIN_INTERVAL_S / 1000
    assert [f["ack"] for f in out.frames] == [1]  # the first at once, the rest paced
    tracker.report(out)  # the status loop: unpaced
    assert out.frames[-1]["ack"] == 100
    clock[0] += worker.ACK_MIN_INTERVAL_S * 1.5
    _feed(tracker, audit, out, 101)  # an interval later: sent at once again
    assert out.frames[-1]["ack"] == 101 and len(out.frames) == 3


@pytest.mark.parametrize("change", ["accepting", "dropped"])
def test_gate_and_loss_changes_are_never_delayed(clock: list[float], change: str) -> None:
    audit, out = _Audit(), _Out()
    tracker = worker._AckTracker(audit)
    _feed(tracker, audit, out, 1)
    if change == "accepting":
        audit.accepting = False
    else:
        audit.dropped = 1
    _feed(tracker, audit, out, 2)  # within the interval, but the gate or the loss count moved
    assert len(out.frames) == 2 and out.frames[-1]["ack"] == 2
    assert out.frames[-1][change] == (False if change == "accepting" else 1)


def test_forced_reports_are_sent_at_once(clock: list[float]) -> None:
    audit, out = _Audit(), _Out()
    tracker = worker._AckTracker(audit)
    _feed(tracker, audit, out, 1)
    _feed(tracker, audit, out, 2)
    assert len(out.frames) == 1
    tracker.report(out, force=True, paced=True)  # a drain's reply follows a forced status
    assert out.frames[-1]["ack"] == 2
