"""Issue 10, finding 8: a slow audit sink (answers, late) is not a dead worker.

A sink whose send is slow must not hold the audit worker's acknowledgements
(the gateway would read that as a hung worker, ``audit_worker_stalled``, and
answer 503): its in-memory events move to its spill file, the other sinks go
on, and every event arrives once the sink is fast again.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.logs.v1 import logs_service_pb2

from audit.event import AuditEvent, Kind, Outcome
from audit.keys import generate_signing_key
from audit.log import AuditLog
from audit.remote import RemoteAuditLog
from audit.sink import SinkUnavailable
from tests.support.waiting import wait_for


_until = wait_for


def _ev(i: int) -> AuditEvent:
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{i}", tenant="tenant-a")


class SlowCollector:
    """OTLP/HTTP logs receiver on loopback that answers every request ``delay_s``
    late (or at once after :meth:`speed_up`). Event ids are recorded when the
    request arrives; ``answered`` counts answers sent."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self.fast = asyncio.Event()
        self.ids: list[str] = []
        self.arrived = 0
        self.answered = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/logs"

    def speed_up(self) -> None:
        self.fast.set()

    async def _handle(self, request: web.Request) -> web.Response:
        req = logs_service_pb2.ExportLogsServiceRequest.FromString(await request.read())
        self.arrived += 1
        for rl in req.resource_logs:
            for sl in rl.scope_logs:
                for rec in sl.log_records:
                    self.ids.append(json.loads(rec.body.string_value)["event_id"])
        try:
            await asyncio.wait_for(self.fast.wait(), self.delay_s)
        except asyncio.TimeoutError:
            pass  # slow, not dead: it answers, late
        self.answered += 1
        return web.Response(body=logs_service_pb2.ExportLogsServiceResponse().SerializeToString(),
                            content_type="application/x-protobuf")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/logs", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self.port = self._runner.addresses[0][1]

    async def stop(self) -> None:
        self.fast.set()
        if self._runner is not None:
            await self._runner.cleanup()


def _section(tmp: Path, otlp_url: str) -> dict[str, Any]:
    key = tmp / "keys" / "audit.key"
    key.parent.mkdir(parents=True)
    generate_signing_key(key)
    return {
        "jsonl": {"dir": str(tmp / "audit"), "signing_key_file": str(key), "checkpoint_s": 600},
        # the collector answers late but answers: a timeout above its delay
        "otlp": {"endpoint": otlp_url, "timeout_s": 60},
        "spill": {"dir": str(tmp / "spill")},
        "summary": False,
    }


def _chain(tmp: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted((tmp / "audit").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            if line.endswith("}"):
                rec = json.loads(line)
                if rec["type"] == "event":
                    out.append(rec["body"])
    return out


async def test_slow_collector_does_not_stall_the_trail_and_every_event_arrives(tmp_path: Path) -> None:
    """OTLP collector answering each request 2.5 s late, stall limit 1 s: the trail
    keeps accepting (no audit_worker_stalled), the JSONL chain gets events while
    the collector still holds its first request, and after the collector speeds
    up every event reaches it; nothing dropped."""
    stall_s = 1.0
    collector = SlowCollector(delay_s=2.5 * stall_s)
    await collector.start()
    rlog = RemoteAuditLog(_section(tmp_path, collector.url), max_backlog_age_s=stall_s)
    await rlog.start()
    ids: list[str] = []
    refused_at: list[int] = []

    def emit(n: int) -> None:
        for _ in range(n):
            ev = _ev(len(ids))
            ids.append(ev.event_id)
            rlog.emit(ev)
            if not rlog.accepting:
                refused_at.append(len(ids))

    try:
        # phase 1: the collector holds its first request; the JSONL sink is not held by it
        emit(10)
        await _until(lambda: collector.arrived >= 1, what="first OTLP request")
        emit(10)
        await _until(lambda: {e["event_id"] for e in _chain(tmp_path)} >= set(ids), what="JSONL events")
        assert collector.answered == 0  # the JSONL sink got them while the OTLP send was still hanging
        # phase 2: traffic goes on for two late answers (> 2 x the stall limit)
        while collector.answered < 2:
            emit(10)
            await asyncio.sleep(0.05)  # pacing of the load, not synchronisation
        assert refused_at == [], f"trail refused traffic at events {refused_at[:5]}"
        assert rlog.accepting
        # phase 3: the collector speeds up: everything arrives
        collector.speed_up()
        assert await rlog.drain(60)
        assert set(ids) <= set(collector.ids)
        chain = _chain(tmp_path)
        assert [e["event_id"] for e in chain if e["kind"] == "inference"] == ids
        assert [e for e in chain if e["kind"] == "alert"] == []  # no audit_worker_stalled, no spill alert
        assert rlog.dropped == 0
        assert b'prefixgate_audit_slow_sends_total{sink="otlp"}' in rlog.worker_metrics_text
    finally:
        await rlog.close()
        await collector.stop()


class GateSink:
    """In-process sink whose first send waits for ``gate`` then ends with
    ``outcome`` ("ok" or "fail"); later sends are immediate."""

    def __init__(self, name: str, outcome: str = "ok") -> None:
        self.name = name
        self.outcome = outcome
        self.gate = asyncio.Event()
        self.in_flight = False
        self.calls = 0
        self.delivered: list[str] = []

    async def open(self) -> None:
        pass

    async def send(self, events: list[AuditEvent]) -> None:
        self.calls += 1
        if self.calls == 1:
            self.in_flight = True
            await self.gate.wait()
            self.in_flight = False
            if self.outcome == "fail":
                raise SinkUnavailable("slow, then gone")
        self.delivered.extend(e.event_id for e in events)

    async def close(self) -> None:
        pass


async def _slow_send_case(tmp_path: Path, outcome: str) -> tuple[list[str], GateSink, GateSink]:
    slow, fast = GateSink("slow", outcome), GateSink("fast")
    fast.calls = 1  # never gated
    alog = AuditLog([slow, fast], tmp_path / "spill", slow_send_s=0.05)
    await alog.start()
    ids = []
    for i in range(5):
        ev = _ev(i)
        ids.append(ev.event_id)
        alog.emit(ev)
    await _until(lambda: slow.in_flight, what="slow send")
    # acknowledgeable although the slow send is still running
    await _until(lambda: alog.durable_n == 5, what="events durable")
    assert slow.in_flight
    await _until(lambda: fast.delivered == ids, what="fast sink")
    for i in range(5, 12):  # spilled behind the copied batch
        ev = _ev(i)
        ids.append(ev.event_id)
        alog.emit(ev)
    await _until(lambda: alog.durable_n == 12, what="later events durable")
    assert slow.in_flight
    slow.gate.set()
    assert await alog.drain(10)
    await alog.close()
    assert alog.dropped == 0
    return ids, slow, fast


async def test_slow_send_that_succeeds_is_not_delivered_twice(tmp_path: Path) -> None:
    ids, slow, fast = await _slow_send_case(tmp_path, "ok")
    assert slow.delivered == ids  # in order, the copied batch skipped in the replay
    assert fast.delivered == ids


async def test_slow_send_that_fails_is_retried_from_the_spill_in_order(tmp_path: Path) -> None:
    ids, slow, fast = await _slow_send_case(tmp_path, "fail")
    assert slow.delivered == ids
    assert fast.delivered == ids
