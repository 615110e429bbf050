"""Session 15, review R14-3: ``prefixgate_audit_events_emitted_total`` counted the JSONL sink's own periodic
checkpoints, forwarded to the other sinks with ``exclude=("jsonl",)`` (audit/log.py ``_forward_checkpoint``),
also when JSONL was the only sink: the checkpoint reached no sink, and emitted minus delivered showed a false
loss, one per ``checkpoint_s``. Now a forward that reaches no sink is not counted (nor given an emit number);
one that reaches another sink is counted once and delivered there."""

from __future__ import annotations

import asyncio
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.event import AuditEvent, Kind, Outcome
from audit.jsonl import JsonlChainSink
from audit.log import AuditLog
from tests.audit.test_log import FlakySink


def _count(alog: AuditLog, name: str, labels: dict[str, str] | None = None) -> float:
    value = alog.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def _ev(i: int) -> AuditEvent:
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{i}")


async def _wait(cond, timeout_s: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while not cond():
        assert loop.time() < end, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_a_forward_excluded_from_every_sink_is_not_counted(tmp_path: Path) -> None:
    only = FlakySink("jsonl")
    alog = AuditLog([only], tmp_path)
    await alog.start()
    alog.emit(_ev(0))
    alog.emit(AuditEvent(kind=Kind.CHECKPOINT, outcome=Outcome.SEALED, checkpoint={"seq": 0}), exclude=("jsonl",))
    alog.emit(_ev(1), exclude=iter(["other"]))  # a one-shot iterable naming no sink of this log: delivered
    assert await alog.drain(5)
    assert _count(alog, "prefixgate_audit_events_emitted_total") == 2  # before: 3
    assert alog.emitted_n == 2
    assert _count(alog, "prefixgate_audit_events_delivered_total", {"sink": "jsonl"}) == 2
    assert len(only.received) == 2
    await alog.close()


async def test_a_forward_reaching_another_sink_is_counted_once(tmp_path: Path) -> None:
    jsonl, other = FlakySink("jsonl"), FlakySink("siem")
    alog = AuditLog([jsonl, other], tmp_path)
    await alog.start()
    cp = AuditEvent(kind=Kind.CHECKPOINT, outcome=Outcome.SEALED, checkpoint={"seq": 0})
    alog.emit(cp, exclude=("jsonl",))
    assert await alog.drain(5)
    assert _count(alog, "prefixgate_audit_events_emitted_total") == 1
    assert other.received == [cp.event_id] and jsonl.received == []
    await alog.close()


async def test_jsonl_alone_emitted_equals_delivered_across_checkpoints(tmp_path: Path) -> None:
    """The review's reproduction: JSONL the only sink, periodic checkpoints while idle."""
    sink = JsonlChainSink(tmp_path / "log", Ed25519PrivateKey.generate(), checkpoint_s=0.05, fsync=False)
    forwarded: list[AuditEvent] = []
    alog = AuditLog([sink], tmp_path / "spill")
    forward = sink.on_checkpoint
    assert forward is not None
    sink.on_checkpoint = lambda ev: (forwarded.append(ev), forward(ev))[1]
    await alog.start()
    for i in range(3):
        alog.emit(_ev(i))
    await _wait(lambda: len(forwarded) >= 1)  # a periodic checkpoint was written and forwarded
    alog.emit(_ev(3))
    await _wait(lambda: len(forwarded) >= 2)
    assert await alog.drain(5)
    emitted = _count(alog, "prefixgate_audit_events_emitted_total")
    delivered = _count(alog, "prefixgate_audit_events_delivered_total", {"sink": "jsonl"})
    assert emitted == delivered == 4  # before: emitted 4 + one per forwarded checkpoint
    assert alog.dropped == 0
    await alog.close()
