"""The audit spool: event frames the gateway hands to its audit worker, also appended to a file
(issue 16, "What a SIGKILL can lose" in docs/audit.md).

The gateway writes each batch of event frames into the worker's pipe before an answer's last
body part (:meth:`audit.remote.RemoteAuditLog.flush_now`). The pipe survives the gateway
alone, not the gateway *and* its worker killed together (a process-group or container kill):
the worker's unread pipe and unwritten batches die with it. So the gateway also appends the
same bytes to a segment file in ``<jsonl.dir>/spool/`` (0700; segments 0600), since session 8 by
one copy into the file's shared memory mapping (:class:`Spool`). The copied bytes are in the page
cache, which outlives every process (not a host crash: nothing here is fsynced).

* Gateway side (:class:`Spool`): one segment per gateway process, ``seg-<n>.frames``
  (``n`` above every segment already there); past :data:`ROTATE_BYTES` a new segment is
  started and the old one removed once the worker acknowledged its last frame (acknowledged =
  written to every sink or its spill file, ``AuditLog.durable_n``). A clean close removes
  them all. A failed write is logged once and counted (``write_errors``); the pipe still
  carries the event.
* Worker side (:func:`recover`): when the worker starts, the segments of *earlier* gateway
  processes (``n`` below the one the gateway passes) are read; every complete frame whose
  event is not in the JSONL chain (by ``event_id``, chain files read newest first, stopping
  at one last modified before the oldest spooled event) is emitted again, followed by one
  ``audit_spool_recovered`` alert event; after a successful drain the segments are removed.
  A torn last line (the write was cut) is skipped. Frames hold what the pipe holds: request
  rows and events (ids, lengths, hashes; no prompt text).

Without a JSONL sink there is no spool (nothing to dedupe against; docs/audit.md).
"""

from __future__ import annotations

import logging
import mmap
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from audit.event import AuditEvent, EventSchemaError, Kind, Outcome
from audit.jsonl import list_log_files
from audit.request_event import request_event

__all__ = ["ROTATE_BYTES", "SLACK_BYTES", "Spool", "recover", "segments", "spool_dir"]

log = logging.getLogger("audit.spool")

#: Bytes after which the gateway starts a new segment (the old one goes once acknowledged).
ROTATE_BYTES = 4 << 20
#: Bytes mapped beyond ROTATE_BYTES, so the batches written before the next rotation check fit.
SLACK_BYTES = 1 << 20
_PREFIX, _SUFFIX = "seg-", ".frames"


def spool_dir(config: Any) -> Path | None:
    """``<jsonl.dir>/spool`` of an ``audit`` worker section (a mapping), or None without a JSONL sink."""
    jsonl = config.get("jsonl") if hasattr(config, "get") else None
    if not jsonl or not jsonl.get("dir"):
        return None
    return Path(jsonl["dir"]) / "spool"


def segments(directory: Path) -> list[tuple[int, Path]]:
    """The segment files in ``directory``, (number, path) in order."""
    out = []
    for p in directory.glob(f"{_PREFIX}*{_SUFFIX}"):
        try:
            out.append((int(p.name[len(_PREFIX):-len(_SUFFIX)]), p))
        except ValueError:
            continue
    return sorted(out)


class Spool:
    """The gateway's side (module doc). ``write`` takes the bytes of one pipe write.

    Since session 8 (issue 14) a segment is a shared memory mapping of its file (``mmap``,
    ``MAP_SHARED``): a write is a copy into the file's pages in the page cache, with no system call,
    where an ``O_APPEND`` ``os.write`` cost ~2-3 µs per answer. The pages are the page cache's, so
    what a write copied outlives the process exactly as a finished ``write`` did (not a host crash:
    nothing is fsynced, as before). The file is allocated ahead (:data:`ROTATE_BYTES` plus
    :data:`SLACK_BYTES`, grown when a write does not fit) and cut to the bytes written when the
    segment is retired or closed; a segment left by a kill ends in zero bytes, which :func:`recover`
    reads as a torn last line. Where the file cannot be mapped, writes are plain ``os.write`` calls.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        existing = segments(directory)
        #: segments of earlier gateway processes (< this) are the worker's to recover
        self.first = (existing[-1][0] + 1) if existing else 1
        self._n = self.first - 1
        self._fd = -1
        self._bytes = 0
        self._mm: mmap.mmap | None = None
        self._retired: list[tuple[int, Path]] = []  # (last seq written to it, path)
        self._path: Path | None = None
        self.write_errors = 0
        self._open()

    def _open(self) -> None:
        self._n += 1
        self._path = self.directory / f"{_PREFIX}{self._n:012d}{_SUFFIX}"
        self._fd = os.open(self._path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o600)
        self._bytes = 0
        try:
            os.posix_fallocate(self._fd, 0, ROTATE_BYTES + SLACK_BYTES)
            self._mm = mmap.mmap(self._fd, ROTATE_BYTES + SLACK_BYTES)
        except (OSError, ValueError):  # no mapping here: plain appends
            os.ftruncate(self._fd, 0)
            self._mm = None

    def _seal(self) -> None:
        """Unmap the segment and cut its file to the bytes written, then close it."""
        if self._mm is not None:
            self._mm.close()
            self._mm = None
            try:
                os.ftruncate(self._fd, self._bytes)
            except OSError as exc:  # the zero tail stays: recovery reads it as a torn line
                log.error("audit spool: could not cut a segment to its frames (%s)", exc)
        os.close(self._fd)
        self._fd = -1

    def write(self, data: bytes) -> None:
        """Append ``data`` (complete frames): one copy into the mapped segment (one ``os.write``
        without a mapping); never raises."""
        try:
            mm = self._mm
            if mm is None:
                os.write(self._fd, data)
            else:
                start = self._bytes
                end = start + len(data)
                if end > len(mm):  # rare: a batch beyond the slack; the mapping grows (mremap)
                    mm.resize(max(end, len(mm) * 2))
                mm[start:end] = data
            self._bytes += len(data)
        except (OSError, ValueError) as exc:
            self.write_errors += 1
            if self.write_errors == 1:
                log.error("audit spool: write failed (%s); events still go to the worker's pipe", exc)

    def acked(self, ack: int, last_seq: int) -> None:
        """The worker acknowledged every frame up to ``ack``; ``last_seq``: the last frame written.
        Starts a new segment past :data:`ROTATE_BYTES` and removes retired, acknowledged ones."""
        if self._bytes >= ROTATE_BYTES and self._path is not None:
            self._seal()
            self._retired.append((last_seq, self._path))
            self._open()
        while self._retired and self._retired[0][0] <= ack:
            _, path = self._retired.pop(0)
            path.unlink(missing_ok=True)

    def close(self, *, remove: bool) -> None:
        """Close the segment; ``remove``: every frame was acknowledged, delete this process's segments."""
        if self._fd >= 0:
            self._seal()
        if remove:
            for _, path in self._retired:
                path.unlink(missing_ok=True)
            if self._path is not None:
                self._path.unlink(missing_ok=True)


def _frames(path: Path) -> Iterator[AuditEvent]:
    with open(path, "rb") as fh:
        for line in fh:
            if not line.endswith(b"\n"):
                break  # torn by the kill
            try:
                frame = orjson.loads(line)
                if frame["t"] == "r":
                    yield request_event(frame["r"])
                elif frame["t"] == "e":
                    yield AuditEvent.from_dict(frame["e"])
            except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, EventSchemaError):
                log.error("audit spool: unreadable frame skipped in %s", path.name)


def _chained_ids(chain_dir: Path, wanted: set[str], since_ms: int) -> set[str]:
    """Which of ``wanted`` event ids the chain in ``chain_dir`` holds (newest files first)."""
    found: set[str] = set()
    for path in reversed(list_log_files(chain_dir)):
        if path.stat().st_mtime * 1000 < since_ms - 2000:
            break  # last written before the oldest spooled event was made
        with open(path, "rb") as fh:
            for line in fh:
                try:
                    eid = orjson.loads(line).get("body", {}).get("event_id")
                except (orjson.JSONDecodeError, AttributeError):
                    continue
                if eid in wanted:
                    found.add(eid)
        if found >= wanted:
            break
    return found


async def recover(audit: Any, directory: Path, chain_dir: Path, below: int) -> int:
    """Emit into ``audit`` the spooled events of segments numbered below ``below`` that the chain in
    ``chain_dir`` lacks; remove those segments once ``audit`` drained. Returns the events emitted."""
    old = [(n, p) for n, p in segments(directory) if n < below]
    if not old:
        return 0
    events = [ev for _, p in old for ev in _frames(p)]
    have = _chained_ids(chain_dir, {e.event_id for e in events}, min((e.time_ms for e in events), default=0))
    missing = [e for e in events if e.event_id not in have]
    for ev in missing:
        audit.emit(ev)
    if missing:
        log.error("audit spool: %d acknowledged events were missing from the chain; recovered", len(missing))
        audit.emit(AuditEvent(kind=Kind.ALERT, outcome=Outcome.RAISED, alert={
            "alert_id": "audit-spool-recovered", "alert_kind": "audit_spool_recovered",
            "recovered_events": len(missing), "segments": len(old)}))
    if await audit.drain(10.0):
        for _, p in old:
            p.unlink(missing_ok=True)
    return len(missing)
