"""S25-review-10 (session 25, lead): a crafted last line of a JSONL audit file (``[1]``, a record whose ``seq``
is a string) stopped the sink's next open with a TypeError (``int(last["seq"])``); now the line is skipped
there, the chain continues from the last whole record, and ``audit verify`` reports the crafted line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from audit.event import AuditEvent, Kind, Outcome
from audit.jsonl import JsonlChainSink, list_log_files
from audit.keys import generate_signing_key, load_signing_key
from audit.verify import verify_files


def _events(n: int, start: int) -> list[AuditEvent]:
    return [AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{start + i}") for i in range(n)]


async def _write(log_dir: Path, key, start: int) -> None:
    sink = JsonlChainSink(log_dir, key, rotate_bytes=10**9, checkpoint_s=3600, fsync=False)
    await sink.open()
    await sink.send(_events(5, start))
    await sink.close()


@pytest.mark.parametrize("crafted", [b"[1]\n", b'{"seq": "7", "hash": "x"}\n', b'{"seq": 9}\n',
                                     # S26-review26-10 (session 27): beyond 64 bits, or negative
                                     b'{"seq": 18446744073709551621, "hash": "x"}\n', b'{"seq": -3, "hash": "x"}\n'])
async def test_a_crafted_last_line_is_skipped_at_open_and_reported_by_verify(tmp_path: Path, crafted: bytes) -> None:
    generate_signing_key(tmp_path / "k.key")
    key = load_signing_key(tmp_path / "k.key")
    log_dir = tmp_path / "log"
    await _write(log_dir, key, 0)
    files = list_log_files(log_dir)
    last = json.loads(files[-1].read_bytes().splitlines()[-1])
    with open(files[-1], "ab") as fh:
        fh.write(crafted)
    await _write(log_dir, key, 5)  # before: TypeError / ValueError from the open
    files = list_log_files(log_dir)
    first_new = json.loads(files[-1].read_bytes().splitlines()[0])
    assert first_new["seq"] == last["seq"] + 1  # the chain goes on from the last whole record
    report = verify_files([log_dir], key.public_key())
    assert not report.ok  # the crafted line is reported, not silently accepted
