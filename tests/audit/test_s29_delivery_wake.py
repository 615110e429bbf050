"""Session 29 (issue 14's audit ratio, S29-audit29): the audit worker's delivery path does less per event.

* ``AuditLog.emit`` wakes a sink's delivery task only when its queue was empty (the task waits only on an
  empty queue): every event still reaches every sink, in emit order, whether it came while the task
  waited, while it was sending, or in a burst.
* ``take_batch`` takes a whole queue at once when it fits in a batch, and the oldest ``size`` otherwise.
"""
from __future__ import annotations

import asyncio
import collections
from pathlib import Path

from audit.event import AuditEvent, Kind, Outcome
from audit.log import AuditLog
from audit.log_delivery import take_batch
from tests.support.waiting import wait_for


def _event(i: int) -> AuditEvent:
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{i}", tenant="tenant-a")


class GatedSink:
    """A sink whose ``send`` waits for ``gate`` (cleared: blocked) and records what it took."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.batches: list[list[str]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.sending = asyncio.Event()

    async def open(self) -> None:
        return None

    async def send(self, events: list[AuditEvent]) -> None:
        self.sending.set()
        await self.gate.wait()
        self.batches.append([ev.request_id for ev in events])

    async def close(self) -> None:
        return None

    def delivered(self) -> list[str]:
        return [r for b in self.batches for r in b]


def test_take_batch_whole_queue_and_oldest_part() -> None:
    q = collections.deque((n, _event(n)) for n in range(1, 6))
    assert [e.request_id for e in take_batch(q, 3)] == ["r1", "r2", "r3"]
    assert [n for n, _ in q] == [4, 5]
    assert [e.request_id for e in take_batch(q, 3)] == ["r4", "r5"]
    assert not q
    assert take_batch(q, 3) == []


async def test_every_event_reaches_every_sink_in_order_across_waits_sends_and_bursts(tmp_path: Path) -> None:
    a, b = GatedSink("a"), GatedSink("b")
    log = AuditLog([a, b], tmp_path / "spill", slow_send_s=None, batch_size=4)
    await log.start()
    try:
        log.emit(_event(1))  # both tasks wait on an empty queue: this one must wake them
        await wait_for(lambda: a.delivered() == ["r1"] and b.delivered() == ["r1"])
        a.gate.clear()
        a.sending.clear()
        log.emit(_event(2))  # wakes both; a blocks in send with r2 taken from its queue
        await wait_for(a.sending.is_set)
        for i in range(3, 12):  # a burst while a sends: a's queue refills from empty, then grows
            log.emit(_event(i))
        await wait_for(lambda: len(b.delivered()) == 11)
        assert a.delivered() == ["r1"]
        a.gate.set()
        assert await log.drain(10)
        want = [f"r{i}" for i in range(1, 12)]
        assert a.delivered() == want and b.delivered() == want
        assert max(len(x) for x in a.batches) <= 4  # the batch size still holds
        log.emit(_event(12))  # idle again: the next event wakes the tasks
        assert await log.drain(10)
        assert a.delivered()[-1] == b.delivered()[-1] == "r12"
    finally:
        await log.close(2)


async def test_emit_after_a_sink_caught_up_on_its_spill_wakes_it(tmp_path: Path) -> None:
    a = GatedSink("a")
    log = AuditLog([a], tmp_path / "spill", slow_send_s=None, queue_size=2)
    await log.start()
    try:
        a.gate.clear()
        a.sending.clear()
        log.emit(_event(1))
        await wait_for(a.sending.is_set)
        for i in range(2, 6):  # the queue (2) fills: the rest goes to the spill, in order
            log.emit(_event(i))
        a.gate.set()
        assert await log.drain(10)
        log.emit(_event(6))  # the queue is empty and no longer spilling: this event must wake the task
        assert await log.drain(10)
        assert a.delivered() == [f"r{i}" for i in range(1, 7)]
        assert log.dropped == 0
    finally:
        await log.close(2)
