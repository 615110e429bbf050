"""Session 10 (issues 14, 16): the gateway's hand-off of a request row builds its frame with one orjson
call; the bytes (what the spool keeps and the worker parses) are exactly those of the earlier
two-call format, and a request row with its span extra still reaches the worker as one frame."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from audit.keys import generate_signing_key
from audit.remote import RemoteAuditLog
from bench.audit_worker_feed import _row
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(60)


def _old_frame(seq: int, row: Any, spans: Any) -> bytes:
    """The frame format up to session 9 (audit/remote.py)."""
    if spans is None:
        return b'{"t":"r","s":%d,"r":%b}\n' % (seq, orjson.dumps(row))
    return b'{"t":"r","s":%d,"r":%b,"x":%b}\n' % (seq, orjson.dumps(row), orjson.dumps(spans))


@pytest.mark.parametrize("spans", [None, (0x1000, 1, 1_764_000_000_000_000_000, None, None),
                                   (2**64 - 1, 0, 1, [(1, 2, 3, 1, True, {"prefixgate.link": "client_traceparent"})],
                                    "a=b,c=d")])
async def test_request_row_frames_are_the_same_bytes_as_before(tmp_path: Path, spans: Any) -> None:
    generate_signing_key(tmp_path / "k")
    log = RemoteAuditLog({"jsonl": {"dir": str(tmp_path / "audit"), "signing_key_file": str(tmp_path / "k")},
                          "spill": {"dir": str(tmp_path / "spill")}})
    rows = [_row(i) for i in range(3)]
    rows[1][6] = "t\u00e9n\u00e4nt \"quoted\" \\ \n"  # escapes and non-ASCII as orjson writes them either way
    rows[2][28] = 1e-300
    for row in rows:
        log.emit_request_row(row, spans)
    # the frames as queued for the pipe and kept for a resend (session 17: queued by emit_request_row itself)
    assert [frame for _, frame, _ in log._unacked] == [_old_frame(i + 1, row, spans) for i, row in enumerate(rows)]
    assert log._out == [_old_frame(i + 1, row, spans) for i, row in enumerate(rows)]


async def test_rows_with_span_extras_reach_the_worker(tmp_path: Path) -> None:
    generate_signing_key(tmp_path / "k")
    log = RemoteAuditLog({"jsonl": {"dir": str(tmp_path / "audit"), "signing_key_file": str(tmp_path / "k")},
                          "spill": {"dir": str(tmp_path / "spill")}})
    await log.start()
    try:
        for i in range(50):
            log.emit_request_row(_row(i), (0x1000 + i, 1, time.time_ns(), None, None))
            if i % 10 == 9:
                log.flush_now()
        assert await log.drain(20.0)
    finally:
        await log.close()
    assert log.dropped == 0

    def inference() -> int:
        n = 0
        for p in (tmp_path / "audit").glob("*.jsonl"):
            n += sum(1 for line in p.read_text().splitlines() if '"kind":"inference"' in line)
        return n
    await wait_for(lambda: inference() == 50)
