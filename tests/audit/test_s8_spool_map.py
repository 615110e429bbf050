"""Session 8 (issue 14): the spool segment is a shared memory mapping (audit/spool.py).

A write is a copy into the file's pages, not a system call; the bytes must still outlive the
writing process killed with SIGKILL (they are the page cache's), a kill-left segment's zero tail
must read as a torn line, and a sealed segment holds exactly the bytes written.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

from audit.spool import ROTATE_BYTES, SLACK_BYTES, Spool, recover, segments
from tests.audit.test_remote import _ev


class _Capture:
    def __init__(self) -> None:
        self.events: list = []

    def emit(self, ev) -> None:
        self.events.append(ev)

    async def drain(self, timeout_s: float) -> bool:
        return True


async def test_frames_copied_into_the_mapping_outlive_a_sigkilled_writer(tmp_path: Path) -> None:
    spool_dir, chain = tmp_path / "spool", tmp_path / "chain"
    chain.mkdir()
    evs = [_ev(i) for i in range(5)]
    frames = b"".join(b'{"t":"e","s":%d,"e":%b}\n' % (i + 1, ev.to_json()) for i, ev in enumerate(evs))
    code = ("import os, signal, sys; from pathlib import Path; from audit.spool import Spool; "
            f"s = Spool(Path({str(spool_dir)!r})); s.write(sys.stdin.buffer.read()); "
            "s.write(b'{\"t\":\"e\",\"s\":6,\"e\":{\"kind\":'); os.kill(os.getpid(), signal.SIGKILL)")
    proc = subprocess.run([sys.executable, "-c", code], input=frames, cwd=Path(__file__).resolve().parents[2],
                          capture_output=True)
    assert proc.returncode == -9, proc.stderr
    (n, path), = segments(spool_dir)
    data = path.read_bytes()
    assert data.startswith(frames) and data.endswith(b"\0")  # the frames, a torn one, the allocated tail
    audit = _Capture()
    assert await recover(audit, spool_dir, chain, n + 1) == 5  # the torn frame and the zeros: skipped
    assert [e.event_id for e in audit.events[:5]] == [ev.event_id for ev in evs]
    assert segments(spool_dir) == []


def test_a_sealed_segment_holds_exactly_the_bytes_written_and_a_big_batch_grows_it(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool")
    small = b'{"t":"r","s":1,"r":[1]}\n'
    big = b"y" * (ROTATE_BYTES + SLACK_BYTES) + b"\n"  # beyond the mapping: it grows
    spool.write(small)
    spool.write(big)
    spool.write(small)
    assert spool.write_errors == 0
    spool.close(remove=False)
    (_, path), = segments(tmp_path / "spool")
    assert path.read_bytes() == small + big + small
    assert orjson.loads(path.read_bytes().splitlines()[-1]) == {"t": "r", "s": 1, "r": [1]}
    assert os.stat(path).st_size == 2 * len(small) + len(big)
