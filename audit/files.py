"""Audit files are created readable by their owner and group only.

Audit records hold SPIFFE IDs, tenant ids and client addresses; spill files
hold whole pending events. A new file gets mode 0640 (``AUDIT_FILE_MODE``:
a log shipper may read through the file's group; others nothing), further
narrowed by the process umask; an existing file keeps its mode.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

__all__ = ["AUDIT_FILE_MODE", "open_append"]

#: Mode of a newly created audit, OCSF or spill file (before the umask).
AUDIT_FILE_MODE = 0o640


def open_append(path: Path | str, *, text: bool = False, buffering: int = -1) -> IO[Any]:
    """Open ``path`` for appending (created with :data:`AUDIT_FILE_MODE` if missing).

    ``text``: UTF-8 text mode, else binary. ``buffering``: the write buffer's size in bytes
    (binary; -1: Python's default, 8 KiB). Raises :class:`OSError`.
    """
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, AUDIT_FILE_MODE)
    try:
        if text:
            return os.fdopen(fd, "a", encoding="utf-8")
        return os.fdopen(fd, "ab", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise
