"""The gateway-side flush timer of the remote audit log (issue 14, session 6).

Every answer hands its event to the worker's pipe (``flush_now``, before the answer's last
body part); the 20 ms flush timer is only the bound for events no hand-off writes. Before
session 6 each event after a hand-off armed a new timer that later fired with nothing to
write (one per answer). Now: answers in a row arm one timer per flush interval, a timer that
fires with nothing pending is not armed again, and an event without a hand-off is still
written within the interval. No worker is started: what matters is what leaves the
gateway's queue (``_out``) and when.
"""
from __future__ import annotations

import asyncio
from typing import Any

from audit.remote import RemoteAuditLog
from tests.support.waiting import wait_for

ROW: list[Any] = ["0" * 32, 1, "tenant-a"]


class _TimerSpy:
    """Wraps the running loop's ``call_later``; keeps every handle it returned for a callback
    bound to ``target`` (the log; not the test's own sleeps)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, target: Any) -> None:
        self.loop = loop
        self.target = target
        self.handles: list[asyncio.TimerHandle] = []
        self._orig = loop.call_later

    def __call__(self, delay: float, cb: Any, *args: Any, **kw: Any) -> asyncio.TimerHandle:
        h = self._orig(delay, cb, *args, **kw)
        if getattr(cb, "__self__", None) is self.target:
            self.handles.append(h)
        return h

    def armed(self) -> list[asyncio.TimerHandle]:
        """Handles not cancelled and not yet due (still to fire)."""
        now = self.loop.time()
        return [h for h in self.handles if not h.cancelled() and h.when() > now]


def _spy(monkeypatch: Any, rlog: RemoteAuditLog) -> _TimerSpy:
    loop = asyncio.get_running_loop()
    spy = _TimerSpy(loop, rlog)
    monkeypatch.setattr(loop, "call_later", spy)
    return spy


async def test_answers_in_a_row_arm_one_timer_and_nothing_pending_leaves_none_armed(monkeypatch: Any) -> None:
    rlog = RemoteAuditLog({}, flush_interval_s=0.05)
    spy = _spy(monkeypatch, rlog)
    for _ in range(100):  # 100 answers well inside one flush interval
        rlog.emit_request_row(ROW)
        assert rlog._out
        await asyncio.sleep(0)
        rlog.flush_now()  # the hand-off before the answer's last body part
        assert not rlog._out
    assert len(spy.handles) == 1, f"{len(spy.handles)} flush timers armed for 100 handed-off answers"
    # the one timer fires with nothing to write and is not armed again
    assert await wait_for(lambda: not spy.armed(), timeout_s=5.0)
    await asyncio.sleep(0)
    assert not spy.armed() and len(spy.handles) == 1
    assert not rlog._out


async def test_an_event_without_a_hand_off_is_written_within_the_interval(monkeypatch: Any) -> None:
    rlog = RemoteAuditLog({}, flush_interval_s=0.05)
    spy = _spy(monkeypatch, rlog)
    rlog.emit_request_row(ROW)
    rlog.flush_now()
    assert len(spy.handles) == 1
    assert await wait_for(lambda: not spy.armed(), timeout_s=5.0)
    # nothing pending, nothing armed; a lone event (no hand-off) arms a timer and is written by it
    t0 = asyncio.get_running_loop().time()
    rlog.emit_request_row(ROW)
    assert len(spy.armed()) == 1
    assert spy.armed()[0].when() <= t0 + 0.05 + 1e-3
    rlog.emit_request_row(ROW)  # a second pending event shares it
    assert len(spy.handles) == 2
    assert await wait_for(lambda: not rlog._out, timeout_s=5.0)


async def test_a_timer_armed_before_a_hand_off_still_bounds_later_events(monkeypatch: Any) -> None:
    rlog = RemoteAuditLog({}, flush_interval_s=0.05)
    spy = _spy(monkeypatch, rlog)
    rlog.emit_request_row(ROW)
    armed_at = asyncio.get_running_loop().time()
    rlog.flush_now()
    rlog.emit_request_row(ROW)  # pending, no hand-off: the timer armed before it writes it
    assert len(spy.handles) == 1 and spy.handles[0].when() <= armed_at + 0.05 + 1e-3
    assert await wait_for(lambda: not rlog._out, timeout_s=5.0)
