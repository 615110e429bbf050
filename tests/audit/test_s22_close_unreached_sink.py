"""Session 22, S21-newcomer-7: ``AuditLog.close`` does not wait for a sink never reached in this run.

With the example's unreachable syslog host, shutdown waited its two bounded drains (``timeout_s`` / 2
each, 10 s in all) for a sink that could take nothing. Now ``close`` waits only for sinks that took
something in this run; an unreached sink's events are already in its spill file (kept, logged with
their byte count, replayed at the next start: nothing is lost), and the other sinks (the local JSONL
chain, the record of truth) are drained as before. A sink that was reached and is down at close is
still waited for (it may come back within the bound)."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from audit.log import AuditLog
from audit.syslog import SyslogSink
from sim.procs import free_port
from tests.audit.test_log import FlakySink, _ev
from tests.support.waiting import wait_for

LONG_S = 3600.0  # a close bound the test would never outlive if close waited for the unreached sink


async def _receiver() -> tuple[asyncio.Server, int, bytearray]:
    got = bytearray()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            got.extend(chunk)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1], got


async def test_close_skips_an_unreached_sink_and_keeps_its_events(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    local = FlakySink("jsonl")  # stands for the local chain: always up
    refused = SyslogSink("127.0.0.1", free_port(), protocol="tcp", connect_timeout_s=1.0)  # nothing listens
    alog = AuditLog([local, refused], tmp_path / "spill", retry_initial_s=0.01, retry_max_s=0.05)
    await alog.start()
    ids = []
    for i in range(50):
        ev = _ev(i)
        ids.append(ev.event_id)
        alog.emit(ev)
    await wait_for(lambda: local.received == ids and alog.spill_pending_bytes > 0, timeout_s=30)
    with caplog.at_level(logging.WARNING, logger="audit.log"):
        await asyncio.wait_for(alog.close(timeout_s=LONG_S), 60)  # before: LONG_S (two drains of LONG_S / 2)
    assert local.received == ids  # the local sink took everything
    kept = [r.getMessage() for r in caplog.records if "not drained at close" in r.getMessage()]
    assert len(kept) == 1 and kept[0].startswith("audit sink syslog not drained at close: "), kept
    assert "syslog.spill.jsonl" in kept[0] and "replayed at the next start" in kept[0]

    # the next start replays them to the sink once it answers: nothing was lost
    server, port, got = await _receiver()
    try:
        again = AuditLog([FlakySink("jsonl"), SyslogSink("127.0.0.1", port, protocol="tcp")], tmp_path / "spill",
                         retry_initial_s=0.01)
        await again.start()
        assert await again.drain(30)
        await wait_for(lambda: all(i.encode() in got for i in ids), timeout_s=30)
        await again.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_close_still_waits_for_a_reached_sink_that_is_down(tmp_path: Path) -> None:
    remote = FlakySink("syslog")
    alog = AuditLog([FlakySink("jsonl"), remote], tmp_path / "spill", retry_initial_s=0.01, retry_max_s=0.02)
    await alog.start()
    first = _ev(0)
    alog.emit(first)
    await wait_for(lambda: remote.received == [first.event_id], timeout_s=30)  # reached once
    remote.down = True
    ids = []
    for i in range(1, 20):
        ev = _ev(i)
        ids.append(ev.event_id)
        alog.emit(ev)
    await wait_for(lambda: alog.spill_pending_bytes > 0, timeout_s=30)
    draining = asyncio.Event()
    real_drain = alog.drain

    async def drain(timeout_s: float = 10.0, *, reached_only: bool = False) -> bool:
        draining.set()
        return await real_drain(timeout_s, reached_only=reached_only)

    alog.drain = drain  # type: ignore[method-assign]
    closing = asyncio.create_task(alog.close(timeout_s=LONG_S))
    await draining.wait()
    remote.down = False  # it comes back while close waits for it
    await asyncio.wait_for(closing, 60)
    assert list(dict.fromkeys(remote.received)) == [first.event_id, *ids]
