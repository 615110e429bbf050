from __future__ import annotations

import asyncio

from audit.event import AuditEvent, Kind, Outcome
from audit.log import AuditLog
from audit.sink import SinkUnavailable


class FlakySink:
    """In-memory sink that can be switched down."""

    def __init__(self, name: str = "mem") -> None:
        self.name = name
        self.down = False
        self.received: list[str] = []

    async def open(self) -> None:
        pass

    async def send(self, events):
        if self.down:
            raise SinkUnavailable("down")
        self.received.extend(e.event_id for e in events)

    async def close(self) -> None:
        pass


def _ev(i: int) -> AuditEvent:
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{i}")


async def test_outage_spills_and_replays_in_order(tmp_path):
    a, b = FlakySink("a"), FlakySink("b")
    alog = AuditLog([a, b], tmp_path, queue_size=8, retry_initial_s=0.01, retry_max_s=0.02)
    await alog.start()
    ids = []
    b.down = True
    for i in range(200):
        ev = _ev(i)
        ids.append(ev.event_id)
        alog.emit(ev)
        if i % 10 == 0:
            await asyncio.sleep(0)
    await asyncio.sleep(0.05)
    assert alog.spill_pending_bytes > 0 and alog.accepting
    b.down = False
    assert await alog.drain(5)
    assert a.received == ids
    assert list(dict.fromkeys(b.received)) == ids
    assert alog.spill_pending_bytes == 0 and alog.dropped == 0
    await alog.close()


async def test_spill_survives_restart(tmp_path):
    s = FlakySink()
    s.down = True
    alog = AuditLog([s], tmp_path, retry_initial_s=0.01)
    await alog.start()
    ids = [e.event_id for e in (_ev(i) for i in range(5)) if not alog.emit(e)]
    await asyncio.sleep(0.05)
    await alog.close(timeout_s=0.2)
    s2 = FlakySink()
    alog2 = AuditLog([s2], tmp_path, retry_initial_s=0.01)
    await alog2.start()
    assert await alog2.drain(5)
    assert s2.received == ids
    await alog2.close()


async def test_spill_full_stops_accepting_and_alerts(tmp_path):
    s = FlakySink()
    s.down = True
    alerts: list[AuditEvent] = []
    alog = AuditLog([s], tmp_path, spill_max_bytes=20_000, queue_size=1, retry_initial_s=0.01, on_alert=alerts.append)
    await alog.start()
    await asyncio.sleep(0.02)
    n = 0
    while alog.accepting and n < 10_000:
        alog.emit(_ev(n))
        n += 1
    assert not alog.accepting
    assert alerts and alerts[0].kind is Kind.ALERT and alerts[0].outcome is Outcome.RAISED
    assert alog.dropped == 0  # still within headroom
    s.down = False
    assert await alog.drain(5)
    assert alog.accepting
    assert alerts[-1].outcome is Outcome.CLEARED
    assert len(set(s.received)) >= n
    await alog.close()


async def test_emit_scrubs_and_counts(tmp_path):
    s = FlakySink()
    alog = AuditLog([s], tmp_path)
    await alog.start()
    alog.emit(AuditEvent(kind=Kind.AUTH, outcome=Outcome.UNAUTHENTICATED, request_id="eyJhbGciOi.eyJzdWIiOi.x"))
    assert await alog.drain(2)
    samples = {
        s.labels["reason"]: s.value
        for m in alog.registry.collect()
        for s in m.samples
        if s.name == "prefixgate_audit_fields_scrubbed_total"
    }
    assert samples == {"jwt_like": 1.0}
    await alog.close()
