"""Per-sink spill file: an append-only JSONL queue on local disk.

Events that a sink cannot take right now are appended here (one JSON object
per line, in emit order) and replayed from a committed read offset when the
sink is back. The offset is persisted next to the file (``.offset``) after
each delivered batch, so a restart replays what was not yet delivered
(at-least-once; a batch delivered just before a crash may be sent twice).

Session 10 (issue 14): appends are buffered and written by :meth:`SpillFile.flush`
(the audit log flushes before it reports an event durable and before a read), and
the events appended in this run are kept in memory beside their lines (at most
:data:`MIRROR_MAX`): a replay takes them from there instead of reading the file
back and decoding every line (``AuditEvent.from_dict``, ~10 µs an event). The file
is written all the same; only its read-back is saved. Leftovers of an earlier run,
and anything beyond the bound, are read from the file as before.
"""
from __future__ import annotations

import collections
import os
from pathlib import Path

import orjson

from audit.event import AuditEvent, EventSchemaError
from audit.files import open_append

#: Most appended events kept in memory for replay (older ones are read back from the file).
MIRROR_MAX = 20_000


class SpillCorrupt(Exception):
    """A spill line could not be parsed back into an event."""


class SpillFile:
    """Append-only event spill with a committed read offset.

    Sizes are bytes. ``pending_bytes`` counts bytes written but not yet
    committed as delivered (including appends not flushed yet).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offset_path = self.path.with_suffix(self.path.suffix + ".offset")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open_append(self.path)
        self._size = self._fh.seek(0, os.SEEK_END)
        self._committed = self._load_offset()
        if self._committed > self._size:
            self._committed = self._size
        self._dirty = False
        #: lines appended since the last :meth:`flush`
        self.unflushed = 0
        # (start offset, end offset, event) of lines appended in this run, oldest first,
        # contiguous up to ``_size``
        self._mirror: collections.deque[tuple[int, int, AuditEvent]] = collections.deque()
        #: batches replayed from memory / read back from the file (for tests and benchmarks)
        self.replayed_from_memory = 0
        self.replayed_from_file = 0

    def _load_offset(self) -> int:
        try:
            return int(self._offset_path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    @property
    def pending_bytes(self) -> int:
        """Bytes appended but not yet committed as delivered."""
        return self._size - self._committed

    @property
    def end_offset(self) -> int:
        """File offset just past the last appended line (for :meth:`commit`)."""
        return self._size

    @property
    def dirty(self) -> bool:
        """True while appended lines wait in the write buffer (see :meth:`flush`)."""
        return self._dirty

    def append(self, line: bytes, event: AuditEvent | None = None) -> int:
        """Append one serialized event (``line`` ends with ``\\n``) to the write buffer; returns
        its size. ``event``: the event ``line`` encodes (kept for a replay without decoding).
        The line reaches the file at :meth:`flush` (or when the buffer fills); raises ``OSError``."""
        start = self._size
        self._fh.write(line)
        self._dirty = True
        self.unflushed += 1
        self._size += len(line)
        mirror = self._mirror
        if event is None:
            mirror.clear()  # the mirror must stay contiguous up to the end
        else:
            if len(mirror) >= MIRROR_MAX:
                mirror.popleft()
            mirror.append((start, self._size, event))
        return len(line)

    def flush(self) -> None:
        """Hand buffered lines to the kernel (what "written to the spill file" means for an
        acknowledgement: :attr:`audit.log.AuditLog.durable_n`). Raises ``OSError``."""
        if self._dirty:
            self._fh.flush()
            self._dirty = False
            self.unflushed = 0

    def discard_unflushed(self) -> None:
        """After a failed :meth:`flush`: forget the buffered lines (the caller counts them lost). What
        part of them reached the file stays there (a torn last line is skipped at read, see
        :meth:`read_batch`); the size is taken from the file again and the in-memory copies dropped."""
        self._dirty = False
        self.unflushed = 0
        self._mirror.clear()
        try:
            self._fh.close()
        except OSError:
            pass
        self._fh = open_append(self.path)
        self._size = self._fh.seek(0, os.SEEK_END)
    def read_batch(self, max_events: int) -> tuple[list[AuditEvent], int]:
        """Up to ``max_events`` events after the committed offset and the
        offset just past them (pass it to :meth:`commit` after delivery).

        Raises:
            SpillCorrupt: a complete line is not a valid event.
        """
        mirror = self._mirror
        pos = self._committed
        while mirror and mirror[0][0] < pos:  # committed already (a commit inside a copied batch)
            mirror.popleft()
        if mirror and mirror[0][0] == pos:
            events = []
            for start, end, event in mirror:
                if len(events) >= max_events:
                    break
                events.append(event)
                pos = end
            self.replayed_from_memory += 1
            return events, pos
        self.flush()
        events = []
        stop = mirror[0][0] if mirror else None  # the rest is in memory
        with open(self.path, "rb") as fh:
            fh.seek(pos)
            while len(events) < max_events and pos != stop:
                line = fh.readline()
                if not line or not line.endswith(b"\n"):
                    break
                try:
                    events.append(AuditEvent.from_dict(orjson.loads(line)))
                except (ValueError, EventSchemaError) as exc:
                    raise SpillCorrupt(f"{self.path}:{pos}: {exc}") from exc
                pos += len(line)
        if events:
            self.replayed_from_file += 1
        return events, pos

    def commit(self, offset: int) -> None:
        """Mark everything before ``offset`` as delivered; truncates the file
        when fully drained."""
        self._committed = offset
        mirror = self._mirror
        while mirror and mirror[0][1] <= offset:
            mirror.popleft()
        if self._committed >= self._size:
            self.reset()
            return
        tmp = self._offset_path.with_suffix(".tmp")
        tmp.write_text(str(offset))
        os.replace(tmp, self._offset_path)

    def reset(self) -> None:
        """Empty the spill (everything delivered)."""
        self._fh.flush()
        self._dirty = False
        self.unflushed = 0
        self._fh.truncate(0)
        self._fh.seek(0)
        self._size = 0
        self._committed = 0
        self._mirror.clear()
        try:
            self._offset_path.unlink()
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Flush and close the append handle (the file and offset stay for the next run)."""
        self._fh.flush()
        self._dirty = False
        self.unflushed = 0
        self._fh.close()
