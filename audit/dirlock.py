"""One writer per audit directory: an exclusive ``flock`` on ``DIR/.lock``.

Two processes writing one hash chain would interleave sequence numbers and
break it; two sharing a spill directory would each replay, commit and reset
the other's spill files. The second one fails at start instead.
"""
from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO


class AuditDirectoryInUse(RuntimeError):
    """Another process holds the directory's lock (one writer per directory)."""


def lock_directory(directory: Path, what: str) -> IO[bytes]:
    """Create ``directory`` if needed and take an exclusive, non-blocking
    ``flock`` on ``directory/.lock``; the lock lives as long as the returned
    file (close it to release; the kernel releases it when the process exits).

    Raises:
        AuditDirectoryInUse: another process holds it (``what`` names the
            directory's role in the message).
        OSError: the directory or lock file cannot be created.
    """
    directory.mkdir(parents=True, exist_ok=True)
    fh = open(directory / ".lock", "a+b")  # noqa: SIM115 - held until released
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise AuditDirectoryInUse(f"{what} {directory} is in use by another writer") from None
    return fh
