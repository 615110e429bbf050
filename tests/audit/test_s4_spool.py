"""Issue 16: an acknowledged audit event survives the gateway AND its audit worker dying together.

The gateway appends every frame it writes into the worker's pipe to a spool segment
(``<jsonl.dir>/spool``, audit/spool.py); the next gateway process's worker emits what the chain
lacks. Here the "gateway" is this test process's :class:`RemoteAuditLog`: its worker is
stopped (SIGSTOP: it reads nothing more), events are handed over with ``flush_now`` (as before
an answer's last byte), then the worker is SIGKILLed and the log abandoned without a close,
as a process-group kill leaves them.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import orjson

from audit.remote import RemoteAuditLog
from audit.spool import ROTATE_BYTES, Spool, segments
from tests.audit.test_remote import _ev, _events, _section, _verify


async def _die_together(rlog: RemoteAuditLog) -> None:
    """SIGKILL the worker and drop the log as a killed gateway would (no close, no ack)."""
    assert rlog._supervisor is not None and rlog.worker_pid is not None
    rlog._supervisor.cancel()  # no restart: the gateway is "dead" too
    with contextlib.suppress(asyncio.CancelledError):
        await rlog._supervisor
    os.kill(rlog.worker_pid, signal.SIGKILL)
    assert rlog._proc is not None
    await rlog._proc.wait()
    if rlog._reader_task is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(rlog._reader_task, 5)
    if rlog._spool is not None:
        os.close(rlog._spool._fd)  # the kernel closes it at the kill; the segment stays


async def test_events_handed_over_before_a_group_kill_are_in_the_chain_after_restart(tmp_path: Path) -> None:
    rlog = RemoteAuditLog(_section(tmp_path))
    await rlog.start()
    early = [_ev(i) for i in range(5)]
    for ev in early:
        rlog.emit(ev)
    assert await rlog.drain(10)  # these are in the chain already: never emitted twice
    pid = rlog.worker_pid
    assert pid  # never os.kill(0): that signals the whole process group (pytest too)
    os.kill(pid, signal.SIGSTOP)
    late = [_ev(i) for i in range(5, 25)]
    for ev in late:
        rlog.emit(ev)
        rlog.flush_now()  # handed over before "the answer's last byte"
    await _die_together(rlog)
    assert not any(e["event_id"] in {ev.event_id for ev in late} for e in _events(tmp_path))  # lost so far

    again = RemoteAuditLog(_section(tmp_path))
    await again.start()  # its worker recovers the previous process's segment before "ready"
    await again.close()
    got = [e["event_id"] for e in _events(tmp_path) if e["kind"] == "inference"]
    assert got == [ev.event_id for ev in early + late]  # every event once, in order
    alerts = [e["alert"] for e in _events(tmp_path) if e["kind"] == "alert"]
    assert [(a["alert_kind"], a["recovered_events"]) for a in alerts] == [("audit_spool_recovered", 20)]
    rep = _verify(tmp_path)
    assert rep.ok, rep
    assert segments(tmp_path / "audit" / "spool") == []  # recovered and closed cleanly: nothing left


async def test_a_clean_close_or_a_gateway_kill_alone_recovers_nothing(tmp_path: Path) -> None:
    rlog = RemoteAuditLog(_section(tmp_path))
    await rlog.start()
    for i in range(10):
        rlog.emit(_ev(i))
    rlog.flush_now()
    await rlog.close()
    assert segments(tmp_path / "audit" / "spool") == []
    # a segment whose events all reached the chain (the worker outlived its gateway): skipped
    spool = Spool(tmp_path / "audit" / "spool")
    events = _events(tmp_path)
    for body in events:
        spool.write(b'{"t":"e","s":1,"e":%b}\n' % orjson.dumps(body))
    spool.write(b'{"t":"e","s":2,"e":{"kind":')  # torn by the kill: skipped
    os.close(spool._fd)
    again = RemoteAuditLog(_section(tmp_path))
    await again.start()
    await again.close()
    after = _events(tmp_path)
    assert [e["event_id"] for e in after] == [e["event_id"] for e in events]
    assert segments(tmp_path / "audit" / "spool") == []


def test_segments_rotate_and_go_once_acknowledged(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    frame = b"x" * 1024 + b"\n"
    for _ in range(ROTATE_BYTES // len(frame) + 1):
        spool.write(frame)
    spool.acked(10, 40)  # over the size: a new segment; the old one waits for seq 40
    assert [n for n, _ in segments(tmp_path / "spool")] == [1, 2]
    spool.acked(39, 41)
    assert [n for n, _ in segments(tmp_path / "spool")] == [1, 2]
    spool.acked(40, 41)
    assert [n for n, _ in segments(tmp_path / "spool")] == [2]
    spool.close(remove=False)
    assert Spool(tmp_path / "spool").first == 3  # a later process writes above every older segment
    assert oct((tmp_path / "spool").stat().st_mode & 0o777) == "0o700"
    assert oct(segments(tmp_path / "spool")[0][1].stat().st_mode & 0o777) == "0o600"
