"""Ed25519 checkpoint signing keys: generate and load (PEM, PKCS#8 / SPKI).

The private key file must live outside the audit log directory (separate
permissions / mount); the public key file is what verifiers get.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey


class KeyFileError(ValueError):
    """A key file is missing, unreadable or not an Ed25519 key."""


def generate_signing_key(private_path: str | Path, public_path: str | Path | None = None) -> Ed25519PublicKey:
    """Create a new Ed25519 key; write the private key (PEM PKCS#8, mode 0600,
    refuses to overwrite) and the public key (PEM SPKI, default
    ``<private>.pub``). Returns the public key.

    Raises:
        FileExistsError: the private or the public key file already exists (neither is ever overwritten: the
            public one may verify older logs, session 22, S22-review-2; the private key just written is removed).
        OSError: a file cannot be created (``FileNotFoundError``: its directory does not exist); when
            the public key cannot be written the private key just written is removed (session 21,
            S21-newcomer-1), so the command can be run again.
    """
    private_path = Path(private_path)
    public_path = Path(public_path) if public_path else private_path.with_name(private_path.name + ".pub")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    pub = key.public_key()
    try:  # never over an existing file: it may be the public key that verifies older logs (S22-review-2)
        fd = os.open(public_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        private_path.unlink()
        raise
    with os.fdopen(fd, "wb") as fh:
        fh.write(pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return pub


def load_signing_key(path: str | Path) -> Ed25519PrivateKey:
    """Load an Ed25519 private key from PEM.

    Raises:
        KeyFileError: unreadable, not an Ed25519 private key, or accessible by
            group/others (``mode & 0o077``, as OpenSSH requires of private keys
            and as the tenancy master secret requires).
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as exc:
        raise KeyFileError(f"cannot load signing key {path}: {exc}") from exc
    if mode & 0o077:
        raise KeyFileError(f"signing key {path} is accessible by group/others "
                           f"(mode {stat.S_IMODE(mode):04o}); chmod 600 it")
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise KeyFileError(f"cannot load signing key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} is not an Ed25519 private key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """Load an Ed25519 public key (PEM SPKI, or the private key PEM). Raises KeyFileError."""
    data = Path(path).read_bytes() if Path(path).exists() else b""
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError:
        return load_signing_key(path).public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} is not an Ed25519 public key")
    return key
