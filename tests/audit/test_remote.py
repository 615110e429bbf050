"""The audit worker process (audit.worker) behind RemoteAuditLog: real child
processes, real JSONL chain + OCSF files, verified with the offline verifier."""
from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from audit.event import AuditEvent, Kind, Outcome, PolicyInfo
from audit.keys import generate_signing_key, load_signing_key
from audit.remote import RemoteAuditLog
from audit.worker_process import AuditWorkerError
from audit.summary import AUDIT_UNAVAILABLE_CODE
from audit.verify import verify_files
from tests.support.waiting import wait_for


def _section(tmp: Path, **extra: Any) -> dict[str, Any]:
    key = tmp / "keys" / "audit.key"
    if not key.exists():
        key.parent.mkdir(parents=True)
        generate_signing_key(key)
    doc: dict[str, Any] = {
        "jsonl": {"dir": str(tmp / "audit"), "signing_key_file": str(key), "checkpoint_s": 600},
        "ocsf": {"file": str(tmp / "ocsf.jsonl")},
        "spill": {"dir": str(tmp / "spill")},
        "summary": False,
    }
    doc.update(extra)
    return doc


def _events(tmp: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted((tmp / "audit").glob("*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            if rec["type"] == "event":
                out.append(rec["body"])
    return out


def _ev(i: int) -> AuditEvent:
    return AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{i}", tenant="tenant-a",
                      prompt_tokens=i, client_address="127.0.0.1")


def _verify(tmp: Path):
    key = load_signing_key(tmp / "keys" / "audit.key")
    return verify_files(sorted((tmp / "audit").glob("*.jsonl")), key.public_key())


async def test_events_reach_every_sink_in_order_and_close_seals_the_chain(tmp_path: Path) -> None:
    rlog = RemoteAuditLog(_section(tmp_path))
    await rlog.start()
    pid = rlog.worker_pid
    ids = []
    for i in range(300):
        ev = _ev(i)
        ids.append(ev.event_id)
        rlog.emit(ev)
        if i % 50 == 0:
            await asyncio.sleep(0)
    assert await rlog.drain(10)
    assert [e["event_id"] for e in _events(tmp_path)] == ids
    ocsf = [json.loads(x) for x in (tmp_path / "ocsf.jsonl").read_text().splitlines()]
    assert [o["metadata"]["uid"] for o in ocsf if o["metadata"].get("uid") in set(ids)] == ids
    await rlog.close()
    assert rlog.dropped == 0
    report = _verify(tmp_path)
    assert report.ok, report.problems
    assert report.unsealed_records == 0  # the final checkpoint was written by the worker at close
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # the worker's metrics reached the gateway side
    assert b"prefixgate_audit_events_delivered_total" in rlog.worker_metrics_text


async def test_bad_config_fails_start_with_the_worker_error(tmp_path: Path) -> None:
    doc = _section(tmp_path)
    doc["jsonl"]["signing_key_file"] = str(tmp_path / "missing.key")
    rlog = RemoteAuditLog(doc, start_timeout_s=20)
    with pytest.raises(AuditWorkerError) as info:
        await rlog.start()
    assert info.value.kind and "missing.key" in str(info.value)
    await rlog.close()


async def test_second_worker_on_the_same_chain_directory_is_refused(tmp_path: Path) -> None:
    first = RemoteAuditLog(_section(tmp_path))
    await first.start()
    second = RemoteAuditLog(_section(tmp_path))
    try:
        with pytest.raises(AuditWorkerError) as info:
            await second.start()
        assert info.value.kind == "AuditDirectoryInUse"
    finally:
        await second.close()
        await first.close()


async def test_killed_worker_is_restarted_and_unacknowledged_events_are_resent(tmp_path: Path) -> None:
    rlog = RemoteAuditLog(_section(tmp_path), restart_initial_s=0.05)
    await rlog.start()
    ids = []
    for i in range(50):
        ev = _ev(i)
        ids.append(ev.event_id)
        rlog.emit(ev)
    assert await rlog.drain(10)
    old = rlog.worker_pid
    assert old is not None
    os.kill(old, signal.SIGKILL)
    await asyncio.sleep(0.05)
    for i in range(50, 120):  # emitted while the worker is dead: kept in the backlog
        ev = _ev(i)
        ids.append(ev.event_id)
        rlog.emit(ev)
    assert rlog.accepting  # the backlog is far below its limit
    assert await rlog.drain(20)
    assert rlog.worker_pid != old
    got = [e["event_id"] for e in _events(tmp_path) if e["kind"] == "inference"]
    assert list(dict.fromkeys(got)) == ids  # every event, in order (re-sends are duplicates by id)
    alerts = [e for e in _events(tmp_path) if e["kind"] == "alert"]
    assert [a["alert"]["alert_kind"] for a in alerts] == ["audit_worker_restarted"]
    await rlog.close()
    assert rlog.dropped == 0
    assert _verify(tmp_path).ok  # the killed worker's unsealed tail is continued by the next file


async def test_backlog_limit_fails_closed_and_refusals_are_summarised(tmp_path: Path) -> None:
    rlog = RemoteAuditLog(_section(tmp_path), max_backlog_bytes=20_000, restart_initial_s=30)
    await rlog.start()
    pid = rlog.worker_pid
    assert pid  # never os.kill(0): that signals the whole process group (pytest too)
    os.kill(pid, signal.SIGKILL)
    await asyncio.sleep(0.2)  # dead, restart far away
    sent = 0
    while rlog.accepting:
        rlog.emit(_ev(sent))
        sent += 1
        assert sent < 1000
    assert rlog.spill_pending_bytes >= 20_000
    for _ in range(3):  # the gateway's own 503 refusals: counted, not queued
        rlog.emit(AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.FAILED, status_code=503,
                             client_address="10.0.0.9", policy=PolicyInfo(None, AUDIT_UNAVAILABLE_CODE, None)))
    before = rlog.spill_pending_bytes
    assert rlog.spill_pending_bytes == before
    await rlog.close(timeout_s=20)  # restarts the worker once more, so the backlog is delivered
    assert rlog.dropped == 0
    events = _events(tmp_path)
    assert len([e for e in events if e["kind"] == "inference"]) == sent
    (summary,) = [e for e in events if e["kind"] == "summary"]
    assert summary["summary"]["suppressed"] == 3 and summary["client_address"] == "10.0.0.9"
    assert [e["alert"]["alert_kind"] for e in events if e["kind"] == "alert"][:1] == ["audit_worker_backlog"]


async def test_gateway_killed_worker_still_seals_the_chain(tmp_path: Path) -> None:
    """stdin EOF (the gateway died, even by SIGKILL) closes the log like ``close``."""
    import subprocess
    import sys

    doc = json.dumps(_section(tmp_path)).encode()
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p))
    proc = subprocess.Popen([sys.executable, "-m", "audit.worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(doc + b"\n")
    proc.stdin.flush()
    assert json.loads(proc.stdout.readline())["t"] == "ready"
    ev = _ev(1)
    proc.stdin.write(b'{"t":"e","s":1,"e":%b}\n' % ev.to_json())
    proc.stdin.write(b"not json\n")  # refused, not fatal
    proc.stdin.close()  # what the kernel does when the gateway dies
    assert proc.wait(20) == 0
    frames = [json.loads(x) for x in proc.stdout.read().splitlines()]
    assert frames[-1] == {"t": "closed"}
    assert any(f["t"] == "status" and f["ack"] == 1 for f in frames)
    assert [f for f in frames if f["t"] == "status"][-1]["dropped"] == 1  # the malformed frame is counted
    assert [e["event_id"] for e in _events(tmp_path)] == [ev.event_id]
    report = _verify(tmp_path)
    assert report.ok and report.unsealed_records == 0


async def test_worker_ignores_sigterm_and_sigint(tmp_path: Path) -> None:
    rlog = RemoteAuditLog(_section(tmp_path))
    await rlog.start()
    pid = rlog.worker_pid or 0
    os.kill(pid, signal.SIGTERM)
    os.kill(pid, signal.SIGINT)
    await asyncio.sleep(0.3)
    os.kill(pid, 0)  # still alive: the gateway decides when the trail closes
    rlog.emit(_ev(1))
    assert await rlog.drain(10)
    await rlog.close()
    assert len(_events(tmp_path)) == 1


async def test_stopped_worker_fills_the_backlog_then_recovers_without_loss(tmp_path: Path) -> None:
    """A worker that stops reading (SIGSTOP): the backlog grows to its limit, the
    trail stops accepting (503), and once the worker runs again everything arrives."""
    rlog = RemoteAuditLog(_section(tmp_path), max_backlog_bytes=30_000)
    await rlog.start()
    pid = rlog.worker_pid or 0
    os.kill(pid, signal.SIGSTOP)
    try:
        ids = []
        while rlog.accepting:
            ev = _ev(len(ids))
            ids.append(ev.event_id)
            rlog.emit(ev)
            if len(ids) % 10 == 0:
                await asyncio.sleep(0.01)  # let the pipe writes happen
            assert len(ids) < 2000
    finally:
        os.kill(pid, signal.SIGCONT)
    assert await rlog.drain(20)
    assert rlog.accepting and rlog.dropped == 0 and rlog.worker_pid == pid  # same worker, nothing resent
    got = [e["event_id"] for e in _events(tmp_path) if e["kind"] == "inference"]
    assert got == ids
    await rlog.close()


def test_unknown_worker_mode_is_a_config_error(tmp_path: Path) -> None:
    from audit.config import AuditConfigError
    from gateway.auditing import AuditHub

    with pytest.raises(AuditConfigError, match="audit.worker"):
        AuditHub.from_config({**_section(tmp_path), "worker": "thread"})


async def test_dropped_count_survives_a_worker_restart(tmp_path: Path) -> None:
    rlog = RemoteAuditLog(_section(tmp_path), restart_initial_s=0.05)
    await rlog.start()
    rlog._write_control({"t": "e", "s": 0, "e": {"schema_version": "1", "bogus": 1}})  # noqa: SLF001 - a frame the worker must refuse
    assert await rlog.drain(10)
    assert rlog.dropped == 1
    old = rlog.worker_pid
    assert old  # never os.kill(0): that signals the whole process group (pytest too)
    os.kill(old, signal.SIGKILL)
    rlog.emit(_ev(1))
    assert await rlog.drain(20)
    assert rlog.worker_pid != old
    assert rlog.dropped == 1  # the new worker counts from 0; the loss is not forgotten
    await rlog.close()


class _SyslogReceiver:
    """Loopback TCP receiver of octet-counted syslog frames (RFC 6587); keeps the
    CEF ``externalId`` (the event id) of every frame, in arrival order."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.server: asyncio.AbstractServer | None = None
        self.port = 0

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        import re

        buf = b""
        while data := await reader.read(65536):
            buf += data
            while b" " in buf:
                length, _, rest = buf.partition(b" ")
                n = int(length)
                if len(rest) < n:
                    break
                frame, buf = rest[:n], rest[n:]
                m = re.search(rb"externalId=([0-9a-f-]{36})", frame)
                if m:
                    self.ids.append(m.group(1).decode())
        writer.close()

    async def start(self, port: int = 0) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


async def test_worker_killed_during_a_sink_outage_loses_nothing(tmp_path: Path) -> None:
    """The syslog receiver is down; events pile up for it; the worker is SIGKILLed
    twice; the receiver comes back: every event reaches every sink, in order."""
    receiver = _SyslogReceiver()
    await receiver.start()
    port = receiver.port
    await receiver.stop()  # down from the start: nothing listens on the port
    doc = _section(tmp_path, syslog={"host": "127.0.0.1", "port": port, "protocol": "tcp", "format": "cef"})
    rlog = RemoteAuditLog(doc, restart_initial_s=0.05)
    await rlog.start()
    ids: list[str] = []

    def emit(k: int) -> None:
        for _ in range(k):
            ev = _ev(len(ids))
            ids.append(ev.event_id)
            rlog.emit(ev)

    # conditions with a deadline, no fixed sleeps (it flaked under load with 0.4 s / 0.3 s sleeps;
    # and ``os.kill(None or 0)`` would signal the whole process group)
    for _ in range(2):
        emit(60)
        await wait_for(lambda: rlog._worker_alive() and not rlog._unacked and rlog.spill_pending_bytes > 0,  # noqa: SLF001
                       20, what="events acknowledged and piled up in the worker's spill for the down receiver")
        pid = rlog.worker_pid
        assert pid
        os.kill(pid, signal.SIGKILL)
        await wait_for(lambda: rlog.worker_pid not in (None, pid) and rlog._worker_alive(),  # noqa: SLF001
                       20, what="a new audit worker ready")
    emit(40)
    await receiver.start(port)
    try:
        assert await rlog.drain(30)
        chain = [e["event_id"] for e in _events(tmp_path) if e["kind"] == "inference"]
        assert list(dict.fromkeys(chain)) == ids
        assert [i for i in dict.fromkeys(receiver.ids) if i in set(ids)] == ids
        assert rlog.dropped == 0
    finally:
        await rlog.close()
        await receiver.stop()


async def test_worker_killed_right_after_taking_events_loses_nothing(tmp_path: Path) -> None:
    """Kill the worker just after it has read a burst (the events sit in its sink
    queues / the 20 ms linger, not yet written): they are resent, none lost."""
    rlog = RemoteAuditLog(_section(tmp_path), restart_initial_s=0.02)
    await rlog.start()
    ids: list[str] = []
    for _ in range(5):
        for _ in range(50):
            ev = _ev(len(ids))
            ids.append(ev.event_id)
            rlog.emit(ev)
        await asyncio.sleep(0.03)  # the pipe flush (20 ms) and the worker's read, not its 20 ms linger
        pid = rlog.worker_pid
        assert pid
        os.kill(pid, signal.SIGKILL)
        # wait for the next worker by condition: a fixed 0.05 s left the supervisor, on a loaded machine,
        # not yet aware of the death, and the next round signalled the reaped pid (ProcessLookupError);
        # ``os.kill(None or 0)`` would signal the whole process group
        await wait_for(lambda: rlog.worker_pid not in (None, pid) and rlog._worker_alive(),  # noqa: SLF001
                       20, what="a new audit worker ready")
    assert await rlog.drain(30)
    chain = [e["event_id"] for e in _events(tmp_path) if e["kind"] == "inference"]
    assert list(dict.fromkeys(chain)) == ids
    assert rlog.dropped == 0
    await rlog.close()


async def test_hung_worker_fails_closed_after_the_backlog_age(tmp_path: Path) -> None:
    """A stopped worker (SIGSTOP) takes nothing: once the oldest unacknowledged
    event is older than max_backlog_age_s the trail stops accepting (503), with
    an alert; it accepts again when the worker runs."""
    rlog = RemoteAuditLog(_section(tmp_path), max_backlog_age_s=0.5)
    await rlog.start()
    pid = rlog.worker_pid or 0
    os.kill(pid, signal.SIGSTOP)
    try:
        rlog.emit(_ev(0))
        assert rlog.accepting  # young backlog: a worker may just be busy
        await wait_for(lambda: not rlog.accepting, what="the backlog to age past 0.5 s")
    finally:
        os.kill(pid, signal.SIGCONT)
    for _ in range(100):
        if rlog.accepting:
            break
        await asyncio.sleep(0.05)
    assert rlog.accepting
    assert await rlog.drain(10)
    kinds = [e["alert"]["alert_kind"] for e in _events(tmp_path) if e["kind"] == "alert"]
    assert kinds == ["audit_worker_stalled"]
    await rlog.close()


async def test_second_worker_on_the_same_spill_directory_is_refused(tmp_path: Path) -> None:
    """Separate chains, one spill directory: each would replay and reset the
    other's spill files, so the second start fails."""
    first = RemoteAuditLog(_section(tmp_path))
    await first.start()
    doc = _section(tmp_path)
    doc["jsonl"] = {**doc["jsonl"], "dir": str(tmp_path / "audit-b")}
    doc["ocsf"] = {"file": str(tmp_path / "ocsf-b.jsonl")}
    second = RemoteAuditLog(doc)
    try:
        with pytest.raises(AuditWorkerError) as info:
            await second.start()
        assert info.value.kind == "AuditDirectoryInUse" and "spill" in str(info.value)
    finally:
        await second.close()
        await first.close()


def test_group_readable_signing_key_is_refused(tmp_path: Path) -> None:
    from audit.keys import KeyFileError

    key = tmp_path / "k" / "audit.key"
    key.parent.mkdir()
    generate_signing_key(key)
    load_signing_key(key)  # 0600: fine
    os.chmod(key, 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_signing_key(key)
