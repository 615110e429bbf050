"""Reading a secret from a file only its owner may read (the master secret, the Redis password)."""

from __future__ import annotations

import os
import stat

__all__ = ["read_private_file"]


def read_private_file(path: str, what: str, max_bytes: int, error: type[Exception]) -> bytes:
    """The bytes of ``path``, refused unless it is a regular file (no symlink followed) that
    group and others cannot access, of at most ``max_bytes`` bytes.

    ``what`` names the file in messages (``"master secret file"``); every refusal raises
    ``error`` with a message that names the path and never holds the content.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise error(f"{what} {path!r} cannot be opened: it does not exist") from None
    except OSError as exc:
        raise error(f"{what} {path!r} cannot be opened: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{what} {path!r} is not a regular file")
        if st.st_mode & 0o077:
            raise error(f"{what} {path!r} is accessible by group/others "
                        f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it")
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, 4096):
            total += len(chunk)
            if total > max_bytes:
                raise error(f"{what} {path!r} is larger than {max_bytes} bytes")
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)
