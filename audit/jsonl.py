"""Tamper-evident JSON Lines sink: sha256 hash chain + Ed25519 checkpoints.

Record format: see :mod:`audit.chain`. Files are named
``audit-<seq of first record, 12 digits>.jsonl`` so lexical order is chain
order; each starts with a header record naming its predecessor file and
carrying the predecessor's last hash as ``prev``. A signed checkpoint is
written every ``checkpoint_s`` seconds (if records were added), before every
rotation (by size ``rotate_bytes`` or age ``rotate_s``) and at close; each
checkpoint is also handed to ``on_checkpoint`` as a ``kind="checkpoint"``
event so :class:`audit.log.AuditLog` can forward it to the other sinks (the
off-host copy that makes tail truncation detectable).

The signing key is loaded by the caller from a path configured separately
from the log directory (someone who can rewrite the logs should not also be
able to re-sign them).
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.dirlock import lock_directory
from audit.chain import GENESIS, canonical_json, encode_record, make_record, sign_checkpoint
from audit.encoded import shared_json
from audit.event import AuditEvent, Kind, Outcome, iso_ms, now_ms
from audit.sink import SinkUnavailable
from audit.files import open_append

log = logging.getLogger(__name__)

FILE_PREFIX = "audit-"
FILE_SUFFIX = ".jsonl"


def file_name_for(seq: int) -> str:
    """Log file name whose first record has sequence number ``seq``."""
    return f"{FILE_PREFIX}{seq:012d}{FILE_SUFFIX}"


def list_log_files(directory: Path) -> list[Path]:
    """Chained log files in ``directory`` in chain order."""
    return sorted(p for p in Path(directory).glob(f"{FILE_PREFIX}*{FILE_SUFFIX}") if p.is_file())


def _last_record(path: Path) -> dict[str, Any] | None:
    last = None
    with open(path, "rb") as fh:
        for line in fh:
            if line.endswith(b"\n"):
                with contextlib.suppress(ValueError):
                    last = json.loads(line)
    return last



#: Bytes of the chain file's write buffer: a batch's records leave in one ``write`` (``send`` flushes at
#: its end, so nothing stays in it after a send: the acknowledgement rules are unchanged).
WRITE_BUFFER = 1 << 20


class JsonlChainSink:
    """Hash-chained, signed, rotating JSONL audit files.

    Args:
        directory: log directory (created).
        signing_key: Ed25519 private key for checkpoints.
        rotate_bytes: rotate when the file reaches this size (bytes).
        rotate_s: rotate when the file is this old (seconds).
        checkpoint_s: seconds between periodic checkpoints.
        fsync: fsync at every checkpoint (durability of sealed records).
        name: sink name (spill file name).
        linger_s: seconds :class:`audit.log.AuditLog` lets events accumulate
            before a send (fewer writes; events wait in memory that long).
        share_json: keep each event's canonical JSON for a second sink that encodes it
            (the OTLP log sink: :func:`audit.encoded.shared_json`); False when there is none
            (:func:`audit.config.build_audit`), so no encoding is kept for nobody.
    """

    def __init__(
        self,
        directory: str | Path,
        signing_key: Ed25519PrivateKey,
        rotate_bytes: int = 64 * 1024 * 1024,
        rotate_s: float = 3600.0,
        checkpoint_s: float = 60.0,
        fsync: bool = True,
        name: str = "jsonl",
        linger_s: float = 0.02,
        share_json: bool = True,
    ) -> None:
        self.name = name
        self.share_json = share_json
        #: seconds AuditLog lets events accumulate before a send (one write per batch)
        self.linger_s = linger_s
        self.directory = Path(directory)
        self._key = signing_key
        self._rotate_bytes = rotate_bytes
        self._rotate_s = rotate_s
        self._checkpoint_s = checkpoint_s
        self._fsync = fsync
        self.on_checkpoint: Callable[[AuditEvent], None] | None = None
        self._fh: IO[bytes] | None = None
        self._path: Path | None = None
        self._seq = -1
        self._head = GENESIS
        self._opened_at = 0.0
        self._size = 0
        self._last_checkpoint_at = 0.0
        self._since_checkpoint = 0
        self._ticker: asyncio.Task[None] | None = None
        self._fsyncs: set[asyncio.Future[None]] = set()  # background checkpoint fsyncs running

    async def open(self) -> None:
        """Continue the chain found in ``directory`` (new file) or start it."""
        if self._fh is not None:
            return
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            self._lock_directory()
            files = list_log_files(self.directory)
            predecessor = None
            if files:
                last = None
                for candidate in reversed(files):
                    last = _last_record(candidate)
                    if last is not None:
                        predecessor = candidate
                        break
                if last is not None:
                    self._seq, self._head = int(last["seq"]), str(last["hash"])
            self._start_file(predecessor.name if predecessor else None)
        except OSError as exc:
            raise SinkUnavailable(f"jsonl open: {exc}") from exc
        if self._ticker is None:
            with contextlib.suppress(RuntimeError):
                self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def send(self, events: list[AuditEvent]) -> None:
        """Append ``events`` as chained records. Raises SinkUnavailable on I/O errors."""
        if self._fh is None:
            await self.open()
        try:
            keep = self.share_json
            for ev in events:
                self._append_event(shared_json(ev, keep))
            assert self._fh is not None
            self._fh.flush()
            now = time.time()
            if self._size >= self._rotate_bytes or now - self._opened_at >= self._rotate_s:
                self.rotate()
            elif now - self._last_checkpoint_at >= self._checkpoint_s:
                self.checkpoint(background_fsync=True)
        except OSError as exc:
            raise SinkUnavailable(f"jsonl write: {exc}") from exc

    def checkpoint(self, background_fsync: bool = False) -> dict[str, Any]:
        """Write a signed checkpoint over the chain head now; returns its body.

        ``background_fsync`` (the periodic checkpoints, session 10): the ``fsync`` runs in a
        thread on a duplicate of the file descriptor instead of on the event loop (18 ms and
        more on a busy disk, every ``checkpoint_s``: a stall of every sink and of the pipe),
        and the checkpoint event is handed to ``on_checkpoint`` when it has returned, so the
        off-host copy still never names a head that is not on disk. Rotation and close keep
        the synchronous ``fsync``."""
        assert self._fh is not None and self._path is not None
        body = sign_checkpoint(
            self._key,
            {"file": self._path.name, "head_seq": self._seq, "head": self._head, "time": iso_ms(now_ms())},
        )
        self._append("checkpoint", body)
        self._fh.flush()
        self._last_checkpoint_at = time.time()
        self._since_checkpoint = 0
        if self._fsync and background_fsync and self._fsync_in_thread(body):
            return body
        if self._fsync:
            os.fsync(self._fh.fileno())
        self._forward(body)
        return body

    def _forward(self, body: dict[str, Any]) -> None:
        if self.on_checkpoint is not None:
            self.on_checkpoint(AuditEvent(kind=Kind.CHECKPOINT, outcome=Outcome.SEALED, checkpoint=dict(body)))

    def _fsync_in_thread(self, body: dict[str, Any]) -> bool:
        """Start the fsync of the current file in the loop's default executor (a ``dup`` of the
        descriptor, closed by the thread: a rotation may close the file meanwhile); forward the
        checkpoint when it returns. False when there is no running loop (do it inline)."""
        assert self._fh is not None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        fd = os.dup(self._fh.fileno())

        def sync() -> None:
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

        def done(fut: asyncio.Future[None]) -> None:
            exc = None if fut.cancelled() else fut.exception()
            if exc is not None:
                log.error("audit jsonl: fsync of checkpoint %s failed: %s", body.get("head_seq"), exc)
            self._forward(body)

        fut = loop.run_in_executor(None, sync)
        fut.add_done_callback(done)
        self._fsyncs.add(fut)
        fut.add_done_callback(self._fsyncs.discard)
        return True

    def rotate(self) -> None:
        """Checkpoint, close the current file and start the next one."""
        assert self._path is not None
        self.checkpoint()
        previous = self._path.name
        self._close_file()
        self._start_file(previous)

    async def close(self) -> None:
        """Final checkpoint and close (idempotent)."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        if self._fsyncs:  # their checkpoints are forwarded before the final one
            await asyncio.gather(*list(self._fsyncs), return_exceptions=True)
        if self._fh is None:
            return
        try:
            self.checkpoint()
        finally:
            self._close_file()
            lock = getattr(self, "_lock_fh", None)
            if lock is not None:
                lock.close()  # releases the flock
                self._lock_fh = None

    # ---- internals --------------------------------------------------
    def _lock_directory(self) -> None:
        """Take an exclusive ``flock`` on ``directory/.lock`` until :meth:`close`.

        Two writers on one chain would interleave sequence numbers and break
        it; a second gateway pointed at a directory in use fails at start
        with :class:`AuditDirectoryInUse` (not retried, not spilled).
        """
        if getattr(self, "_lock_fh", None) is not None:
            return
        self._lock_fh = lock_directory(self.directory, "audit log directory")

    def _start_file(self, predecessor: str | None) -> None:
        self._path = self.directory / file_name_for(self._seq + 1)
        # one write per send, not one per 8 KiB (~8 records): send flushes at its end (session 13)
        self._fh = open_append(self._path, buffering=WRITE_BUFFER)
        self._size = self._fh.tell()
        self._opened_at = time.time()
        self._last_checkpoint_at = self._opened_at
        self._append("header", {"file": self._path.name, "predecessor": predecessor, "created": iso_ms(now_ms())})
        self._fh.flush()

    def _close_file(self) -> None:
        if self._fh is not None:
            self._fh.flush()
            if self._fsync:
                os.fsync(self._fh.fileno())
            self._fh.close()
        self._fh = None

    def _append(self, rtype: str, body: dict[str, Any]) -> None:
        assert self._fh is not None
        self._seq += 1
        rec = make_record(self._seq, rtype, self._head, body)
        line = canonical_json(rec) + b"\n"
        self._fh.write(line)
        self._size += len(line)
        self._head = rec["hash"]
        if rtype != "checkpoint":
            self._since_checkpoint += 1

    def _append_event(self, body_json: bytes) -> None:
        """:meth:`_append` of an ``event`` record whose body is already canonical JSON
        (the same bytes, one body encoding: :func:`audit.chain.encode_record`)."""
        assert self._fh is not None
        self._seq += 1
        line, self._head = encode_record(self._seq, "event", self._head, body_json)
        self._fh.write(line)
        self._size += len(line)
        self._since_checkpoint += 1

    async def _tick(self) -> None:
        interval = max(self._checkpoint_s / 4, 0.05)
        while True:
            await asyncio.sleep(interval)
            if self._fh is None:
                continue
            now = time.time()
            try:
                if now - self._opened_at >= self._rotate_s and self._since_checkpoint:
                    self.rotate()
                elif now - self._last_checkpoint_at >= self._checkpoint_s and self._since_checkpoint:
                    self.checkpoint(background_fsync=True)
            except OSError:
                pass  # next send() reports the failure
