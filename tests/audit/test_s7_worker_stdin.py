"""Session 7 (issue 14): the audit worker reads its stdin pipe at most once per interval, so a busy
worker wakes once per batch of answers, not once per answer; nothing written is lost or reordered."""
from __future__ import annotations

import asyncio
import os
import threading

from audit.worker_stdin import BatchedPipeReader


def _writer(fd: int, frames: list[bytes], gap_s: float, done: threading.Event) -> None:
    for f in frames:
        os.write(fd, f)
        done.wait(gap_s)  # spaced writes, as answers arrive one by one
    os.close(fd)


async def _read_all(reader: BatchedPipeReader) -> bytes:
    out = b""
    while True:
        data = await reader.read()
        if not data:
            return out
        out += data


def test_spaced_writes_are_read_in_few_reads_in_order_and_eof_comes_last() -> None:
    r, w = os.pipe()
    frames = [b'{"t":"r","s":%d}\n' % i for i in range(40)]
    reader = BatchedPipeReader(r, interval_s=2.0)
    stop = threading.Event()
    t = threading.Thread(target=_writer, args=(w, frames, 0.002, stop))
    t.start()
    try:
        got = asyncio.run(asyncio.wait_for(_read_all(reader), 60))
    finally:
        stop.set()
        t.join()
        os.close(r)
    assert got == b"".join(frames)
    # 40 writes over ~80 ms: the first read, then (2 s later) all the rest, then EOF; a reader
    # waking on readability would need up to 40
    assert reader.reads <= 4


def test_interval_zero_reads_as_soon_as_data_is_there() -> None:
    r, w = os.pipe()
    reader = BatchedPipeReader(r, interval_s=0.0)

    async def go() -> list[bytes]:
        got = []
        for i in range(3):
            os.write(w, b"x%d\n" % i)
            got.append(await asyncio.wait_for(reader.read(), 10))
        return got

    try:
        assert asyncio.run(go()) == [b"x0\n", b"x1\n", b"x2\n"]
    finally:
        os.close(w)
        os.close(r)


def test_readline_then_read_hands_over_the_rest_and_eof() -> None:
    r, w = os.pipe()
    os.write(w, b'{"config":1}\n{"t":"r"}\n{"t":')
    os.close(w)
    reader = BatchedPipeReader(r, interval_s=0.0)

    async def go() -> tuple[bytes, bytes, bytes]:
        return await reader.readline(), await reader.read(), await reader.read()

    try:
        assert asyncio.run(go()) == (b'{"config":1}\n', b'{"t":"r"}\n{"t":', b"")
    finally:
        os.close(r)


def test_the_worker_reads_its_stdin_through_the_batched_reader() -> None:
    import audit.worker as worker

    assert worker.BatchedPipeReader is BatchedPipeReader
    assert worker.READ_INTERVAL_S > 0
