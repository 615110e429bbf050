"""Session 10 (issue 14): the spill's cheaper path keeps its guarantees.

Spilled lines are buffered and flushed before :attr:`AuditLog.durable_n` answers (an acknowledged
event is in the file); a replay takes the events appended in this run from memory (no read-back,
no decoding) and still reads a previous run's leftovers, and the part beyond the in-memory bound,
from the file, in order; the JSONL sink's periodic checkpoints fsync in a thread and are forwarded
after it, and the chain verifies.
"""
from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from audit import spill as spill_mod
from audit.chain import key_id
from audit.event import AuditEvent, Kind, Outcome
from audit.jsonl import JsonlChainSink
from audit.keys import generate_signing_key, load_signing_key
from audit.log import AuditLog
from audit.log_spill import encode_line
from audit.spill import SpillFile
from audit.verify import verify_files
from tests.audit.test_i10_slow_sink import GateSink
from tests.support.waiting import wait_for


def _ev(i: int) -> AuditEvent:
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{i}", tenant="tenant-a",
                      time_ms=1_764_000_000_000 + i)


def _file_ids(path: Path) -> list[str]:
    return [orjson.loads(line)["event_id"] for line in path.read_bytes().splitlines()]


def test_replay_from_memory_then_file_after_restart(tmp_path: Path) -> None:
    path = tmp_path / "s.spill.jsonl"
    sp = SpillFile(path)
    evs = [_ev(i) for i in range(10)]
    for ev in evs:
        sp.append(encode_line(ev), ev)
    assert sp.dirty and sp.unflushed == 10
    batch, end = sp.read_batch(4)
    assert batch == evs[:4] and all(a is b for a, b in zip(batch, evs))  # the objects, not decoded copies
    assert sp.replayed_from_memory == 1 and sp.replayed_from_file == 0
    sp.commit(end)
    sp.flush()
    assert _file_ids(path) == [e.event_id for e in evs]  # written all the same
    sp.close()
    again = SpillFile(path)  # a restart: the committed offset, then the file
    batch, end = again.read_batch(100)
    assert batch == evs[4:] and again.replayed_from_file == 1
    newer = [_ev(i) for i in range(10, 13)]
    for ev in newer:
        again.append(encode_line(ev), ev)
    batch, end2 = again.read_batch(100)  # the leftovers stop where the in-memory part starts
    assert batch == evs[4:] and end2 == end
    again.commit(end)
    batch, end3 = again.read_batch(100)
    assert batch == newer and all(a is b for a, b in zip(batch, newer))
    again.commit(end3)
    assert again.pending_bytes == 0 and path.stat().st_size == 0
    again.close()


def test_mirror_bound_reads_the_oldest_from_the_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(spill_mod, "MIRROR_MAX", 3)
    sp = SpillFile(tmp_path / "s.spill.jsonl")
    evs = [_ev(i) for i in range(8)]
    for ev in evs:
        sp.append(encode_line(ev), ev)
    got: list[AuditEvent] = []
    while sp.pending_bytes:
        batch, end = sp.read_batch(2)
        got.extend(batch)
        sp.commit(end)
    assert got == evs
    assert sp.replayed_from_file >= 1 and sp.replayed_from_memory >= 1
    sp.close()


def test_line_without_event_ends_the_memory_path(tmp_path: Path) -> None:
    sp = SpillFile(tmp_path / "s.spill.jsonl")
    evs = [_ev(i) for i in range(4)]
    sp.append(encode_line(evs[0]), evs[0])
    sp.append(encode_line(evs[1]))  # no event: everything before it must come from the file
    sp.append(encode_line(evs[2]), evs[2])
    batch, end = sp.read_batch(10)
    assert batch == evs[:2]
    sp.commit(end)
    batch, end = sp.read_batch(10)
    assert batch == evs[2:3] and batch[0] is evs[2]
    sp.close()


async def test_spilled_events_are_in_the_file_when_durable(tmp_path: Path) -> None:
    """A sink stuck in a slow send: its events are spilled; durable_n covers them only once the
    lines are in the spill file (read here with a separate handle), and all arrive in order."""
    slow, fast = GateSink("slow"), GateSink("fast")
    fast.calls = 1
    alog = AuditLog([slow, fast], tmp_path / "spill", slow_send_s=0.05)
    await alog.start()
    evs = [_ev(i) for i in range(6)]
    for ev in evs[:3]:
        alog.emit(ev)
    await wait_for(lambda: slow.in_flight, what="slow send")
    await wait_for(lambda: alog.durable_n == 3, what="copied batch durable")
    for ev in evs[3:]:
        alog.emit(ev)  # spilled behind the copy, buffered
    assert alog.durable_n == 3  # the fast sink has not taken them yet
    await wait_for(lambda: alog.durable_n == 6, what="all durable")
    assert _file_ids(tmp_path / "spill" / "slow.spill.jsonl") == [e.event_id for e in evs]
    slow.gate.set()
    assert await alog.drain(10)
    await alog.close()
    assert slow.delivered == [e.event_id for e in evs] and fast.delivered == slow.delivered
    assert alog.dropped == 0


async def test_background_checkpoint_fsync_forwards_after_and_verifies(tmp_path: Path) -> None:
    generate_signing_key(tmp_path / "k.key")
    key = load_signing_key(tmp_path / "k.key")
    sink = JsonlChainSink(tmp_path / "logs", key, checkpoint_s=0.05)
    forwarded: list[AuditEvent] = []
    sink.on_checkpoint = forwarded.append
    await sink.open()
    for i in range(5):
        await sink.send([_ev(10 * i + j) for j in range(10)])
        await asyncio.sleep(0.06)  # past checkpoint_s: the next send writes a periodic checkpoint
    await wait_for(lambda: len(forwarded) >= 2, what="checkpoints forwarded after their fsync")
    await sink.close()
    assert forwarded[-1].checkpoint is not None and forwarded[-1].checkpoint["key_id"] == key_id(key.public_key())
    report = verify_files([tmp_path / "logs"], key.public_key(),
                          off_host_checkpoints=[dict(e.checkpoint or {}) for e in forwarded])
    assert report.ok, report.problems
    assert report.records >= 50
