"""The public keys ``audit verify`` trusts, by key id (S23-newcomer-4: verify across a signing-key rotation).

Every checkpoint names the key that signed it (``key_id``, :func:`audit.chain.key_id`: the first
16 hex characters of sha256 of the raw Ed25519 public key). After a rotation of the signing key a
directory holds checkpoints of two (or more) keys; the verifier checks each checkpoint with the
given key of its ``key_id`` (:func:`audit.verify.verify_files`), and a checkpoint whose key id
no given key has is a problem of its own (``unknown_key``), not a bad signature.

A key ring is a ``dict`` key id -> :class:`Ed25519PublicKey`. Building it refuses a key id given
twice, whether the same key twice or two different keys whose ids collide (64 bits of sha256: a
collision is not out of reach of a determined forger), so a checkpoint's key is never ambiguous.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from audit.chain import key_id
from audit.keys import KeyFileError, load_public_key

#: what :func:`audit.verify.verify_files` accepts as its trusted key(s)
TrustedKeys = Ed25519PublicKey | Iterable[Ed25519PublicKey] | Mapping[str, Ed25519PublicKey]


class DuplicateKeyError(KeyFileError):
    """A key id is given twice (the same public key twice, or two keys whose ids collide)."""


def _raw(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_ring(keys: TrustedKeys, labels: Iterable[str] | None = None) -> dict[str, Ed25519PublicKey]:
    """``{key_id: public key}`` of ``keys`` (one key, several, or a ring already built).

    Args:
        keys: one Ed25519 public key, an iterable of them, or a mapping key id -> key (checked:
            each id must be the key's own).
        labels: names of the keys in the order given (file names), for the error message.

    Raises:
        DuplicateKeyError: two keys with one key id (message names the id and both labels).
        KeyFileError: a mapping whose id is not its key's id; no key at all.
    """
    if isinstance(keys, Ed25519PublicKey):
        keys = [keys]
    if isinstance(keys, Mapping):
        for kid, key in keys.items():
            if key_id(key) != kid:
                raise KeyFileError(f"key ring entry {kid} holds the key of id {key_id(key)}")
        ring = dict(keys)
    else:
        ring, names = {}, {}
        label_list = list(labels) if labels is not None else []
        for index, key in enumerate(keys):
            kid = key_id(key)
            label = label_list[index] if index < len(label_list) else f"key #{index + 1}"
            if kid in ring:
                same = "the same public key given twice" if _raw(ring[kid]) == _raw(key) else "two different keys"
                raise DuplicateKeyError(f"key id {kid} is given twice ({names[kid]} and {label}): {same}; "
                                        "give each checkpoint key once")
            ring[kid], names[kid] = key, label
    if not ring:
        raise KeyFileError("no public key given")
    return ring


def load_key_ring(paths: Iterable[str | Path]) -> dict[str, Ed25519PublicKey]:
    """The key ring of public key files and/or directories (a directory: every ``*.pub`` inside, sorted).

    Raises:
        DuplicateKeyError: a key id found twice (names both files).
        KeyFileError: a file is not an Ed25519 key; a directory holds no ``*.pub``; no path at all.
    """
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(p.glob("*.pub"))
            if not found:
                raise KeyFileError(f"{p}: a directory of public keys, but it holds no *.pub file")
            files.extend(found)
        else:
            files.append(p)
    return key_ring([load_public_key(f) for f in files], labels=[str(f) for f in files])


__all__ = ["DuplicateKeyError", "TrustedKeys", "key_ring", "load_key_ring"]
