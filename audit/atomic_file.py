"""Replace a file atomically and durably: the one implementation of the pattern (session 25, D1/D2).

The pattern: a temporary file in the SAME directory as the target (a rename is atomic only within one
file system, POSIX ``rename(2)``), its mode set on the open descriptor before a byte is written, the
data written, flushed and ``fsync``-ed, ``os.replace`` onto the target, then the directory ``fsync``-ed
so that the rename itself survives a crash (``fsync(2)``: "calling fsync() on the file does not
necessarily ensure that the entry in the directory containing the file has also reached disk"). A
reader sees the old file or the new one, never a part; a failed write leaves the old file untouched
and no temporary file behind.

Before session 25 this was written three times (``policy/store_versions.py``, ``tenancy/cli.py``
``rotate-master``, ``sim/spiffe_issuer.py``) and once more in ``tenancy/state.py``, differing in mode,
``chmod`` and directory ``fsync``. No maintained library was taken: ``atomicwrites`` (last release
1.4.1, 2022; archived by its author) is unmaintained, ``atomicfile`` / ``atomic-write-path`` have had
no release since 2020, and ``safer`` (maintained) is a general stream wrapper that neither sets the mode
before the rename nor ``fsync``-s the directory.

It lives in ``audit`` for the reason ``audit/tls.py`` does: ``audit`` imports no other PrefixGate
package, so ``policy``, ``tenancy`` and ``sim`` can all take it without a new edge between them
(docs/architecture.md). It imports nothing but the standard library.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

__all__ = ["DEFAULT_MODE", "write_atomic"]

#: the mode of a file written with ``mode=None``: ``tempfile.mkstemp``'s own, owner read/write only
DEFAULT_MODE = 0o600


def write_atomic(path: str | os.PathLike[str], data: bytes, mode: int | None = None, fsync_dir: bool = True) -> None:
    """Replace the file at ``path`` with ``data`` (bytes), atomically and durably (module docstring).

    Args:
        path: the target; its directory must exist (the temporary file ``.<name>.<random>.tmp`` is made
            there).
        data: the whole new content, in bytes.
        mode: permission bits of the new file (e.g. ``0o600``, ``0o644``), set with ``fchmod`` on the
            temporary file BEFORE any data is written and before the rename, so there is no moment at
            which the target exists with a wider mode. ``None``: :data:`DEFAULT_MODE` (0600). The umask
            does not apply (``fchmod``).
        fsync_dir: ``fsync`` the directory after the rename (default; ``False`` only for files whose loss
            in a crash is harmless, such as a readiness file).

    Raises:
        OSError: the temporary file could not be made, written, synced or renamed (the old file, if any,
            is intact and the temporary file is removed), or the directory could not be synced (the new
            file is then in place).
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if fsync_dir:
        dfd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
