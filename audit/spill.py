"""Per-sink spill file: an append-only JSONL queue on local disk.

Events that a sink cannot take right now are appended here (one JSON object
per line, in emit order) and replayed from a committed read offset when the
sink is back. The offset is persisted next to the file (``.offset``) after
each delivered batch, so a restart replays what was not yet delivered
(at-least-once; a batch delivered just before a crash may be sent twice).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from audit.event import AuditEvent, EventSchemaError
from audit.files import open_append


class SpillCorrupt(Exception):
    """A spill line could not be parsed back into an event."""


class SpillFile:
    """Append-only event spill with a committed read offset.

    Sizes are bytes. ``pending_bytes`` counts bytes written but not yet
    committed as delivered.
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

    def append(self, line: bytes) -> int:
        """Append one serialized event (``line`` ends with ``\\n``); returns its size."""
        self._fh.write(line)
        self._fh.flush()
        self._size += len(line)
        return len(line)

    def read_batch(self, max_events: int) -> tuple[list[AuditEvent], int]:
        """Up to ``max_events`` events after the committed offset and the
        offset just past them (pass it to :meth:`commit` after delivery).

        Raises:
            SpillCorrupt: a complete line is not a valid event.
        """
        events: list[AuditEvent] = []
        pos = self._committed
        with open(self.path, "rb") as fh:
            fh.seek(pos)
            while len(events) < max_events:
                line = fh.readline()
                if not line or not line.endswith(b"\n"):
                    break
                try:
                    events.append(AuditEvent.from_dict(json.loads(line)))
                except (ValueError, EventSchemaError) as exc:
                    raise SpillCorrupt(f"{self.path}:{pos}: {exc}") from exc
                pos += len(line)
        return events, pos

    def commit(self, offset: int) -> None:
        """Mark everything before ``offset`` as delivered; truncates the file
        when fully drained."""
        self._committed = offset
        if self._committed >= self._size:
            self.reset()
            return
        tmp = self._offset_path.with_suffix(".tmp")
        tmp.write_text(str(offset))
        os.replace(tmp, self._offset_path)

    def reset(self) -> None:
        """Empty the spill (everything delivered)."""
        self._fh.truncate(0)
        self._fh.seek(0)
        self._size = 0
        self._committed = 0
        try:
            self._offset_path.unlink()
        except FileNotFoundError:
            pass

    def close(self) -> None:
        """Close the append handle (the file and offset stay for the next run)."""
        self._fh.close()
