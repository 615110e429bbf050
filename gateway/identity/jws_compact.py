"""Decoding a compact JWS (RFC 7515 7.1) without trusting it: segments, JSON, signature bytes.

Strict base64url/JSON decoding of the header and payload (duplicate members
refused, RFC 7515 4), the canonical spelling of the signature segment, the
signature length an algorithm and key imply (RFC 7518 3.3-3.5), and
:func:`canonical_token_sha256`, the name of a token that its ECDSA high-S twin
shares. Verifies nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import math
import re
from typing import Any

import jwt

from .bearer import Reason, _fail

#: Largest accepted compact JWS, in bytes.
MAX_TOKEN_BYTES = 8 * 1024
#: Compact JWS shape. The signature segment may be empty so that an unsecured
#: JWS (``alg: none``, RFC 7515 A.5) is parsed and refused as ``alg_not_allowed``
#: (the precise reason, useful in the audit trail); with any allowed alg an
#: empty signature never verifies.
_COMPACT_RE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")


#: ECDSA JWS algorithms (RFC 7518 3.4): curve order n (SEC 2 v2 2.4-2.6,
#: FIPS 186-4 D.1.2) and the byte length of each of R and S in the JWS
#: signature (R || S, big-endian, fixed width).
_EC_ORDER: dict[str, tuple[int, int]] = {
    "ES256": (0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551, 32),
    "ES384": (
        0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFC7634D81F4372DDF581A0DB248B0A77AECEC196ACCC52973,
        48,
    ),
    "ES512": (
        int("01FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF"
            "FA51868783BF2F966B7FCC0148F709A5D03BB5C9B8899C47AEBB6FB71E91386409", 16),
        66,
    ),
}


def canonical_token_sha256(token: str) -> str:
    """A name for a compact JWS that its ECDSA twin shares (hex SHA-256).

    ECDSA signatures are malleable: if ``(r, s)`` is valid so is
    ``(r, n - s)`` (the "high-S twin"), and anyone can compute it without the
    key. RFC 7518 3.4 does not require the low-S form and common issuers do
    not produce it (Go's ``crypto/ecdsa``, which SPIRE signs with, and
    OpenSSL emit either form), so the verifier accepts both
    (docs/identity.md, "ECDSA twins"). ``sha256(token)`` is therefore not a
    unique name for a signed token; this is: SHA-256 over
    ``header "." payload "."`` (the exact base64url segments) followed by the
    signature bytes with ``s`` replaced by ``min(s, n - s)`` for ES256/384/512
    (other algorithms: the signature bytes as they are). Key any cache,
    replay set or revocation list of tokens on it, never on the raw string.

    Pure; does not verify anything (a cache hit must still be a token that
    was verified under this name). Raises :class:`AuthenticationError`
    ``malformed`` when ``token`` is not a compact JWS with a JSON header.
    """
    if not isinstance(token, str) or not _COMPACT_RE.fullmatch(token):
        raise _fail(Reason.MALFORMED, "token is not a compact JWS (base64url header.payload.signature)")
    h_seg, p_seg, s_seg = token.split(".")
    alg = _b64json(h_seg, "header").get("alg")
    try:
        sig = base64.urlsafe_b64decode(s_seg + "=" * (-len(s_seg) % 4))
    except (binascii.Error, ValueError):
        raise _fail(Reason.MALFORMED, "token signature is not base64url") from None
    return canonical_name(f"{h_seg}.{p_seg}", sig, alg)


def canonical_name(signing_input: str, sig: bytes, alg: Any) -> str:
    """:func:`canonical_token_sha256` from its parts: ``header "." payload``
    (the base64url segments), the decoded signature bytes and the header's
    ``alg`` (hex SHA-256). Lets the verifier name a token it has already
    parsed without decoding its header again."""
    ec = _EC_ORDER.get(alg) if isinstance(alg, str) else None
    if ec is not None and len(sig) == 2 * ec[1]:
        n, size = ec
        s = int.from_bytes(sig[size:], "big")
        if n // 2 < s < n:  # s >= n never verifies: left as it is
            sig = sig[:size] + (n - s).to_bytes(size, "big")
    return hashlib.sha256(f"{signing_input}.".encode("ascii") + sig).hexdigest()


def _strict_json(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError("duplicate member")
        out[k] = v
    return out


def _b64json(segment: str, what: str) -> dict[str, Any]:
    try:
        raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        obj = json.loads(raw, object_pairs_hook=_strict_json)
    except (binascii.Error, ValueError, RecursionError):
        raise _fail(Reason.MALFORMED, f"token {what} is not base64url JSON without duplicate members") from None
    if not isinstance(obj, dict):
        raise _fail(Reason.MALFORMED, f"token {what} is not a JSON object")
    return obj


def _number(claims: dict[str, Any], name: str) -> float | None:
    v = claims.get(name)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _fail(Reason.MALFORMED, f"claim {name!r} is not a NumericDate")
    return float(v)


def _strict_b64(segment: str) -> bytes:
    """Decode a base64url segment, refusing any other spelling of the same bytes
    (non-zero pad bits): a cached token is found only under its one spelling."""
    try:
        raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
    except (binascii.Error, ValueError):
        raise _fail(Reason.MALFORMED, "token signature is not base64url") from None
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") != segment:
        raise _fail(Reason.MALFORMED, "token signature is not canonical base64url")
    return raw


def _signature_len(alg: str, pyjwk: jwt.PyJWK) -> int | None:
    """Byte length a JWS signature must have for ``alg`` with this key
    (RFC 7518 3.3-3.5: RSA = modulus size, ECDSA = 2 x coordinate size)."""
    ec = _EC_ORDER.get(alg)
    if ec is not None:
        return 2 * ec[1]
    size = getattr(pyjwk.key, "key_size", None)
    return (size + 7) // 8 if isinstance(size, int) else None
