"""Hash-chain record format shared by the JSONL sink and the verifier.

Each line of a chained audit file is one JSON object::

    {"seq": n, "type": "header"|"event"|"checkpoint", "prev": <hex>,
     "body": {...}, "hash": <hex>}

``hash = sha256(canonical_json({seq, type, prev, body}))`` and ``prev`` is the
``hash`` of the record before it (across files: a file's header ``prev`` is
the last hash of its predecessor file, named in ``body.predecessor``). The
very first record uses ``GENESIS``. Canonical JSON: sorted keys, no spaces,
UTF-8 (RFC 8785-like for the value types we use: strings, ints, floats,
bools, objects).

A checkpoint body is ``{"file", "head_seq", "head", "time", "key_id",
"sig"}`` where ``sig`` is an Ed25519 signature (RFC 8032) over
``canonical_json`` of the body without ``sig``; ``head`` is the hash of the
record just before the checkpoint.
"""
from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

import orjson

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

GENESIS = "0" * 64


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON bytes (sorted keys, compact, UTF-8, non-ASCII not
    escaped), encoded with orjson.

    Raises:
        TypeError: a value JSON cannot hold (orjson.JSONEncodeError).
    """
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS)


def legacy_canonical_json(value: Any) -> bytes:
    """The encoding of files written before 0.1.0's orjson switch (stdlib
    ``json``); identical except for floats below 1e-4 (``1e-05`` vs
    ``0.00001``). The verifier accepts either."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def record_hash(seq: int, rtype: str, prev: str, body: dict[str, Any], legacy: bool = False) -> str:
    """sha256 hex of the canonical record without its ``hash`` field
    (``legacy``: with :func:`legacy_canonical_json`)."""
    encode = legacy_canonical_json if legacy else canonical_json
    return hashlib.sha256(encode({"seq": seq, "type": rtype, "prev": prev, "body": body})).hexdigest()


def make_record(seq: int, rtype: str, prev: str, body: dict[str, Any]) -> dict[str, Any]:
    """A chained record dict (see module docstring)."""
    return {"seq": seq, "type": rtype, "prev": prev, "body": body, "hash": record_hash(seq, rtype, prev, body)}


def encode_record(seq: int, rtype: str, prev: str, body_json: bytes) -> tuple[bytes, str]:
    """``(line, hash)`` of a chained record whose body is already canonical JSON.

    ``body_json`` must be ``canonical_json(body)``; ``line`` is then byte for byte
    ``canonical_json(make_record(seq, rtype, prev, body)) + b"\n"`` and ``hash`` its
    ``hash`` (sorted keys ``body < hash < prev < seq < type``; orjson encodes a nested
    dict exactly as on its own), so the body is encoded once instead of twice.

    Raises:
        TypeError: ``seq`` not an ``int`` (a bool or float would encode differently).
    """
    if type(seq) is not int:
        raise TypeError("encode_record: seq must be an int")
    tail = b',"prev":%b,"seq":%d,"type":%b}' % (orjson.dumps(prev), seq, orjson.dumps(rtype))
    digest = hashlib.sha256(b'{"body":%b%b' % (body_json, tail)).hexdigest()
    return b'{"body":%b,"hash":"%b"%b\n' % (body_json, digest.encode(), tail), digest


def key_id(public_key: Ed25519PublicKey) -> str:
    """Short id of a signing key: first 16 hex chars of sha256(raw public key)."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def sign_checkpoint(key: Ed25519PrivateKey, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` plus ``key_id`` and base64url ``sig`` (Ed25519 over the
    canonical body without ``sig``)."""
    unsigned = dict(body, key_id=key_id(key.public_key()))
    unsigned.pop("sig", None)
    sig = key.sign(canonical_json(unsigned))
    return dict(unsigned, sig=base64.urlsafe_b64encode(sig).decode())


def checkpoint_signature_ok(public_key: Ed25519PublicKey, body: dict[str, Any]) -> bool:
    """True if ``body['sig']`` is a valid signature by ``public_key``."""
    from cryptography.exceptions import InvalidSignature

    sig = body.get("sig")
    if not isinstance(sig, str):
        return False
    unsigned = {k: v for k, v in body.items() if k != "sig"}
    try:
        raw = base64.urlsafe_b64decode(sig)
    except ValueError:
        return False
    for encode in (canonical_json, legacy_canonical_json):
        try:
            public_key.verify(raw, encode(unsigned))
            return True
        except (InvalidSignature, ValueError, TypeError, RecursionError):  # S25-review-4: a value an encoding
            continue  # cannot hold (orjson: an integer beyond 64 bits), which no signer wrote: not a crash
    return False
