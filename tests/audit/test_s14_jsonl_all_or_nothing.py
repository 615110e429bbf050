"""RV2-3: a JSONL send whose write fails leaves nothing behind; its retry writes each record once.

Before session 14 the chain file had a write buffer: a send whose flush failed (ENOSPC, EIO) kept its
records in the buffer with the chain state advanced, and the delivery loop's retry of the batch wrote
both copies. Now a send is one ``os.write`` of whole records (looped over short writes), cut back with
``ftruncate`` and the chain state restored when it fails. The failures here are injected by a wrapper
of ``os.write`` that fails only for the chain file's descriptor.
"""
from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.event import AuditEvent, Kind, Outcome
from audit.jsonl import JsonlChainSink, list_log_files
from audit.log import AuditLog
from audit.sink import SinkUnavailable
from audit.verify import verify_files


def _events(n: int, start: int = 0) -> list[AuditEvent]:
    return [AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{start + i}") for i in range(n)]


class FailingWrites:
    """``os.write`` for the descriptors in ``fds``: the next ``fail`` calls write ``partial`` of the
    bytes asked for (0 = none), then the call after a partial one raises ENOSPC."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, partial: float) -> None:
        self.real = os.write
        self.fds: set[int] = set()
        self.fail = 0
        self.partial = partial
        self.failed = 0
        self._half_done = False
        monkeypatch.setattr(os, "write", self)

    def __call__(self, fd: int, data: bytes) -> int:  # the shape of os.write
        if fd not in self.fds or not self.fail:
            return self.real(fd, data)
        if self.partial and not self._half_done:
            self._half_done = True
            return self.real(fd, bytes(data)[: max(1, int(len(data) * self.partial))])
        self.fail -= 1
        self.failed += 1
        self._half_done = False
        raise OSError(errno.ENOSPC, "No space left on device (injected)")


def _records(directory: Path) -> list[dict]:
    out = []
    for f in list_log_files(directory):
        raw = f.read_bytes()
        assert raw.endswith(b"\n"), f"{f.name} ends in a partial record"
        out += [json.loads(line) for line in raw.splitlines()]
    return out


@pytest.mark.parametrize("partial", [0.0, 0.5])
async def test_failed_send_retried_writes_each_record_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           partial: float) -> None:
    key = Ed25519PrivateKey.generate()
    forwarded: list[AuditEvent] = []
    sink = JsonlChainSink(tmp_path / "log", key, checkpoint_s=0, fsync=False)  # a checkpoint in every send
    sink.on_checkpoint = forwarded.append
    writes = FailingWrites(monkeypatch, partial)
    await sink.open()
    assert sink._fh is not None
    writes.fds.add(sink._fh.fileno())
    await sink.send(_events(20, 0))
    size_before = sum(f.stat().st_size for f in list_log_files(tmp_path / "log"))
    forwarded_before = len(forwarded)
    writes.fail = 1
    batch = _events(20, 20)
    with pytest.raises(SinkUnavailable):
        await sink.send(batch)
    assert writes.failed == 1
    # nothing of the failed send is on disk or forwarded
    assert sum(f.stat().st_size for f in list_log_files(tmp_path / "log")) == size_before
    assert len(forwarded) == forwarded_before
    await sink.send(batch)  # the delivery loop's retry of the same batch
    await sink.send(_events(20, 40))
    await sink.close()
    ids = [r["body"]["request_id"] for r in _records(tmp_path / "log") if r["type"] == "event"]
    assert ids == [f"r{i}" for i in range(60)]  # no duplicate, nothing lost, in order
    report = verify_files([tmp_path / "log"], key.public_key(),
                          off_host_checkpoints=[c.checkpoint for c in forwarded])
    assert report.ok, report.problems
    assert report.unsealed_records == 0


async def test_failed_send_through_the_audit_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The delivery loop (spill, retry) over a chain whose write fails once mid-run: 400 events, 400 records."""
    key = Ed25519PrivateKey.generate()
    sink = JsonlChainSink(tmp_path / "log", key, checkpoint_s=3600, fsync=False)
    writes = FailingWrites(monkeypatch, 0.5)
    alog = AuditLog([sink], tmp_path / "spill", batch_size=16, retry_initial_s=0.01, retry_max_s=0.02)
    await alog.start()
    assert sink._fh is not None
    writes.fds.add(sink._fh.fileno())
    events = _events(400)
    for i, ev in enumerate(events):
        if i == 150:
            writes.fail = 1
        alog.emit(ev)
        if i % 25 == 0:
            assert await alog.drain(5)
    assert await alog.drain(5)
    await alog.close()
    assert writes.failed == 1 and alog.dropped == 0
    ids = [r["body"]["request_id"] for r in _records(tmp_path / "log") if r["type"] == "event"]
    assert ids == [f"r{i}" for i in range(400)]
    assert verify_files([tmp_path / "log"], key.public_key()).ok


async def test_a_cut_that_fails_continues_the_chain_in_a_new_file(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed write whose cut-back fails too: the file is let go, the next send continues the chain from
    the disk in a new file. Nothing was written (the write failed before any byte): nothing doubled."""
    key = Ed25519PrivateKey.generate()
    sink = JsonlChainSink(tmp_path / "log", key, checkpoint_s=3600, fsync=False)
    writes = FailingWrites(monkeypatch, 0.0)
    await sink.open()
    assert sink._fh is not None
    writes.fds.add(sink._fh.fileno())
    await sink.send(_events(10, 0))
    writes.fail = 1

    def no_cut(fd: int, length: int) -> None:
        raise OSError(errno.EIO, "injected")

    monkeypatch.setattr(os, "ftruncate", no_cut)
    with pytest.raises(SinkUnavailable):
        await sink.send(_events(10, 10))
    await sink.send(_events(10, 10))
    await sink.close()
    assert len(list_log_files(tmp_path / "log")) == 2
    ids = [r["body"]["request_id"] for r in _records(tmp_path / "log") if r["type"] == "event"]
    assert ids == [f"r{i}" for i in range(20)]
    assert verify_files([tmp_path / "log"], key.public_key()).ok


async def test_close_after_the_file_was_let_go_releases_the_directory(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A sink whose file was let go (failed cut) and that is closed before another send still releases the
    log directory's lock: a second sink can open the chain and continue it."""
    key = Ed25519PrivateKey.generate()
    sink = JsonlChainSink(tmp_path / "log", key, checkpoint_s=3600, fsync=False)
    writes = FailingWrites(monkeypatch, 0.0)
    await sink.open()
    assert sink._fh is not None
    writes.fds.add(sink._fh.fileno())
    await sink.send(_events(5, 0))
    writes.fail = 1
    with monkeypatch.context() as m:
        m.setattr(os, "ftruncate", lambda fd, length: (_ for _ in ()).throw(OSError(errno.EIO, "injected")))
        with pytest.raises(SinkUnavailable):
            await sink.send(_events(5, 5))
    await sink.close()
    again = JsonlChainSink(tmp_path / "log", key, checkpoint_s=3600, fsync=False)
    await again.send(_events(5, 5))
    await again.close()
    ids = [r["body"]["request_id"] for r in _records(tmp_path / "log") if r["type"] == "event"]
    assert ids == [f"r{i}" for i in range(10)]
    assert verify_files([tmp_path / "log"], key.public_key()).ok


async def test_a_line_that_fails_to_build_leaves_the_chain_as_it_was(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Review R14-1: an error while a batch's lines are built (an encoder bug, not an OSError) writes
    nothing and puts the chain state back: the next batch chains off the last record on disk."""
    import audit.jsonl as jsonl_module

    key = Ed25519PrivateKey.generate()
    sink = JsonlChainSink(tmp_path / "log", key, checkpoint_s=3600, fsync=False)
    await sink.open()
    await sink.send(_events(3, 0))
    real = jsonl_module.shared_json
    calls = [0]

    def failing_second(ev: AuditEvent, keep: bool) -> bytes:
        calls[0] += 1
        if calls[0] == 2:
            raise TypeError("injected encoder bug")
        return real(ev, keep)

    monkeypatch.setattr(jsonl_module, "shared_json", failing_second)
    with pytest.raises(TypeError):
        await sink.send(_events(2, 3))
    monkeypatch.setattr(jsonl_module, "shared_json", real)
    await sink.send(_events(2, 5))
    await sink.close()
    records = [r for r in _records(tmp_path / "log") if r["type"] == "event"]
    assert [r["body"]["request_id"] for r in records] == ["r0", "r1", "r2", "r5", "r6"]
    assert [r["seq"] for r in records] == sorted(r["seq"] for r in records)
    report = verify_files([tmp_path / "log"], key.public_key())
    assert report.ok, report.problems
