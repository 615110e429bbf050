"""Loading and checking the key ring's master secret, and the key ring's errors.

The master secret comes from a file (refused if group/world accessible) or an
environment variable, never from the configuration file. Error messages name
the source (file path or variable name), never the secret.
"""

from __future__ import annotations

import os

from tenancy.private_file import read_private_file

MIN_MASTER_SECRET_BYTES = 32


_MAX_FILE_BYTES = 64 * 1024


class KeyRingError(Exception):
    """Master secret missing/unsafe/short, or key-ring state unusable.

    Messages name the source (file path or variable name), never the secret.
    """


class MasterUnchanged(KeyRingError):
    """:meth:`KeyRing.rotate_master` was given the master secret already in use."""


def load_master_secret(file: str | None, env: str | None) -> bytes:
    """Load the master secret from ``file`` (preferred) or environment variable ``env``.

    The file must be a regular file with no group/other permission bits
    (``mode & 0o077 == 0``, as OpenSSH requires of private keys); it is opened
    with ``O_NOFOLLOW`` and checked with ``fstat`` on the open descriptor. One
    trailing newline is stripped. From ``env`` the value's UTF-8 bytes are
    used. A file that is named but unusable is an error (no fallback to env).
    Returns at least :data:`MIN_MASTER_SECRET_BYTES` (32) bytes; raises
    :class:`KeyRingError` otherwise. Error messages never contain the secret.
    """
    if file:
        secret = _read_secret_file(file)
        source = f"master secret file {file!r}"
    elif env:
        value = os.environ.get(env)
        if value is None or value == "":
            raise KeyRingError(f"master secret environment variable {env!r} is not set")
        secret = value.encode("utf-8")
        source = f"master secret environment variable {env!r}"
    else:
        raise KeyRingError("no master secret source configured (need a file or an environment variable)")
    if len(secret) < MIN_MASTER_SECRET_BYTES:
        raise KeyRingError(
            f"{source} is too short: {len(secret)} bytes, need at least {MIN_MASTER_SECRET_BYTES}"
        )
    return secret


def _read_secret_file(path: str) -> bytes:
    data = read_private_file(path, "master secret file", _MAX_FILE_BYTES, KeyRingError)
    if data.endswith(b"\r\n"):
        data = data[:-2]
    elif data.endswith(b"\n"):
        data = data[:-1]
    return data


def check_master_secret(secret: bytes) -> None:
    """Raise :class:`KeyRingError` unless ``secret`` is bytes of at least
    :data:`MIN_MASTER_SECRET_BYTES`; the message never contains the secret."""
    if not isinstance(secret, (bytes, bytearray)):
        raise KeyRingError("master secret must be bytes")
    if len(secret) < MIN_MASTER_SECRET_BYTES:
        raise KeyRingError(
            f"master secret is too short: {len(secret)} bytes, need at least {MIN_MASTER_SECRET_BYTES}"
        )
