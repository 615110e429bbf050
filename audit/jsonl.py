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

Key rotation (session 24, S23-fixverify-1): when the chain's last checkpoint
was signed by another key than this sink's, the header of the file this sink
opens names that key as retired (``"retires": <old key_id>, "key_id": <new
key_id>``). The header is chained like any record, so the new key's first
checkpoint seals it; ``audit verify`` then refuses any checkpoint of the
retired key after that header (``retired_key``): a leaked old private key can
no longer sign a forged tail behind the new key's checkpoints.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from audit.dirlock import lock_directory
from audit.chain import GENESIS, canonical_json, encode_record, key_id, make_record, sign_checkpoint
from audit.encoded import shared_json
from audit.event import AuditEvent, Kind, Outcome, iso_ms, now_ms
from audit.sink import SinkUnavailable
from audit.files import open_append
from audit.jsonl_files import FILE_PREFIX, FILE_SUFFIX, file_name_for, list_log_files, retired_keys, tail

__all__ = ["FILE_PREFIX", "FILE_SUFFIX", "JsonlChainSink", "file_name_for", "list_log_files"]

log = logging.getLogger(__name__)


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
        self.key_id = key_id(signing_key.public_key())
        #: key id the next header retires (the chain's last checkpoint key, when not this sink's: open())
        self._retires: str | None = None

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
                last, signer = None, None
                for candidate in reversed(files):
                    found, signed = tail(candidate)
                    if last is None and found is not None:
                        last, predecessor = found, candidate
                    signer = signer or signed
                    if last is not None and signer is not None:
                        break
                if last is not None:
                    self._seq, self._head = int(last["seq"]), str(last["hash"])
                self._retires = signer if signer not in (None, self.key_id) else None
                if self._retires is not None and self.key_id in retired_keys(files):
                    log.error("audit jsonl: signing key id %s was retired earlier in this chain; `audit verify` "
                              "refuses its checkpoints (retired_key): sign with a new key", self.key_id)
            self._start_file(predecessor.name if predecessor else None)
        except OSError as exc:
            raise SinkUnavailable(f"jsonl open: {exc}") from exc
        if self._ticker is None:
            with contextlib.suppress(RuntimeError):
                self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def send(self, events: list[AuditEvent]) -> None:
        """Append ``events`` as chained records. Raises SinkUnavailable on I/O errors.

        All or nothing (RV2-3): the batch's records, and the checkpoint it is due, leave in one
        :meth:`_write`; if that fails, the file is cut back to its length before the send and the
        chain state (sequence, head, size) restored, so the delivery loop's retry of the batch writes
        each record once. A failure while the lines are built (before anything is written) restores
        the chain state too and propagates as it is (review R14-1: the next batch would otherwise
        chain off records that were never written). A failure after the batch is on disk (rotation)
        never fails the send."""
        if self._fh is None:
            await self.open()
        mark = self._mark()
        try:
            keep = self.share_json
            try:  # building a line advances the chain state: a failure here (an encoder bug) puts it back
                lines = [self._event_line(shared_json(ev, keep)) for ev in events]
                now = time.time()
                rotate = self._size >= self._rotate_bytes or now - self._opened_at >= self._rotate_s
                body = None
                if rotate or now - self._last_checkpoint_at >= self._checkpoint_s:
                    body = self._checkpoint_body()
                    lines.append(self._line("checkpoint", body))
            except BaseException:
                self._seq, self._head, self._size, self._since_checkpoint = mark
                raise
            self._write(b"".join(lines), mark)
        except OSError as exc:
            raise SinkUnavailable(f"jsonl write: {exc}") from exc
        if body is None:
            return
        try:  # the records are written: what is left must not make the delivery loop send them again
            self._checkpointed(body, background_fsync=not rotate)
            if rotate:
                self._next_file()
        except OSError as exc:
            log.error("audit jsonl: after a written batch: %s (the next send reopens the chain)", exc)
            self._drop_file()

    def checkpoint(self, background_fsync: bool = False) -> dict[str, Any]:
        """Write a signed checkpoint over the chain head now; returns its body.

        ``background_fsync`` (the periodic checkpoints, session 10): the ``fsync`` runs in a
        thread on a duplicate of the file descriptor instead of on the event loop (18 ms and
        more on a busy disk, every ``checkpoint_s``: a stall of every sink and of the pipe),
        and the checkpoint event is handed to ``on_checkpoint`` when it has returned, so the
        off-host copy still never names a head that is not on disk. Rotation and close keep
        the synchronous ``fsync``. Raises ``OSError`` (the chain state then is as before the call)."""
        assert self._fh is not None and self._path is not None
        mark = self._mark()
        body = self._checkpoint_body()
        self._write(self._line("checkpoint", body), mark)
        self._checkpointed(body, background_fsync)
        return body

    def _checkpoint_body(self) -> dict[str, Any]:
        """The signed body of a checkpoint over the current head (the next record's ``seq`` is its own)."""
        assert self._path is not None
        return sign_checkpoint(
            self._key,
            {"file": self._path.name, "head_seq": self._seq, "head": self._head, "time": iso_ms(now_ms())},
        )

    def _checkpointed(self, body: dict[str, Any], background_fsync: bool) -> None:
        """After a checkpoint record is written: the period restarts, fsync (in a thread or here),
        then the checkpoint is forwarded (:meth:`_forward`)."""
        assert self._fh is not None
        self._last_checkpoint_at = time.time()
        self._since_checkpoint = 0
        if self._fsync and background_fsync and self._fsync_in_thread(body):
            return
        if self._fsync:
            os.fsync(self._fh.fileno())
        self._forward(body)

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
        self.checkpoint()
        self._next_file()

    def _next_file(self) -> None:
        """Close the current file (its last record a checkpoint) and start the next one."""
        assert self._path is not None
        previous = self._path.name
        self._close_file()
        self._start_file(previous)

    def _drop_file(self) -> None:
        """Let go of the current file after an error outside a batch's write: the next send's
        :meth:`open` continues the chain from what is on disk, in a new file."""
        fh, self._fh = self._fh, None
        if fh is not None:
            with contextlib.suppress(OSError):
                fh.close()

    async def close(self) -> None:
        """Final checkpoint and close (idempotent)."""
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
            self._ticker = None
        if self._fsyncs:  # their checkpoints are forwarded before the final one
            await asyncio.gather(*list(self._fsyncs), return_exceptions=True)
        try:
            if self._fh is not None:  # None: never opened, closed, or let go after an error (_drop_file)
                try:
                    self.checkpoint()
                finally:
                    self._close_file()
        finally:
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
        # unbuffered: every write is one os.write of whole records (_write), nothing is left in a
        # buffer after a failed one (RV2-3)
        self._fh = open_append(self._path, buffering=0)
        try:
            self._size = os.fstat(self._fh.fileno()).st_size
            self._opened_at = time.time()
            self._last_checkpoint_at = self._opened_at
            header = {"file": self._path.name, "predecessor": predecessor, "created": iso_ms(now_ms())}
            if self._retires is not None:  # a key rotation: sealed by this key's first checkpoint
                header.update(retires=self._retires, key_id=self.key_id)
            self._append("header", header)
            self._retires = None  # the next files of this run are this key's
        except OSError:
            self._drop_file()  # a file without its header is never written to: open() starts it again
            raise

    def _close_file(self) -> None:
        if self._fh is not None:
            if self._fsync:
                os.fsync(self._fh.fileno())
            self._fh.close()
        self._fh = None

    def _mark(self) -> tuple[int, str, int, int]:
        """The chain state a failed :meth:`_write` restores: (seq, head, size, records since checkpoint)."""
        return self._seq, self._head, self._size, self._since_checkpoint

    def _write(self, data: bytes, mark: tuple[int, str, int, int]) -> None:
        """Write ``data`` (whole records) at the end of the file, all of it or none of it.

        ``os.write`` may write part of ``data`` (a full disk); the rest is written in a loop.
        On ``OSError`` the file is cut back to ``mark``'s size and the chain state restored
        (a retry then writes the same records once, chained as before), and the error re-raised.
        If the cut itself fails the file is let go (:meth:`_drop_file`): the next send reopens
        the chain from what is on disk, in a new file.
        """
        assert self._fh is not None
        fd = self._fh.fileno()
        view = memoryview(data)
        done = 0
        try:
            while done < len(data):
                n = os.write(fd, view[done:])
                if n <= 0:
                    raise OSError(errno.EIO, "audit jsonl: write returned 0")
                done += n
        except OSError:
            self._seq, self._head, self._size, self._since_checkpoint = mark
            try:
                os.ftruncate(fd, mark[2])
            except OSError as exc:
                log.error("audit jsonl: cannot cut back a failed write (%s): the chain continues in a new file", exc)
                self._drop_file()
            raise

    def _line(self, rtype: str, body: dict[str, Any]) -> bytes:
        """The next record (``rtype``, ``body``) as a line; the chain state moves past it."""
        self._seq += 1
        rec = make_record(self._seq, rtype, self._head, body)
        line = canonical_json(rec) + b"\n"
        self._size += len(line)
        self._head = rec["hash"]
        if rtype != "checkpoint":
            self._since_checkpoint += 1
        return line

    def _append(self, rtype: str, body: dict[str, Any]) -> None:
        """Write one record now (all or nothing, :meth:`_write`)."""
        mark = self._mark()
        self._write(self._line(rtype, body), mark)

    def _event_line(self, body_json: bytes) -> bytes:
        """The next ``event`` record whose body is already canonical JSON, as a line (the same
        bytes, one body encoding: :func:`audit.chain.encode_record`); the chain state moves past it."""
        self._seq += 1
        line, self._head = encode_record(self._seq, "event", self._head, body_json)
        self._size += len(line)
        self._since_checkpoint += 1
        return line

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
