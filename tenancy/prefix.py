"""Per-tenant HMAC block-hash chain over prompt tokens.

A prompt of token ids is cut into full blocks of ``block_size`` tokens (a
trailing partial block is not hashed: a KV block is reusable only when full,
as in vLLM's prefix caching). Block ``i`` gets the key

    h_0 = b"pg-prefix-v1" || key_id
    h_i = HMAC-SHA256(tenant_key, h_{i-1} || block_i)[:digest_size]

where ``block_i`` is the block's token ids packed as unsigned 32-bit
big-endian integers. Because each key covers its whole prefix, two requests
share ``h_i`` only if their first ``i`` blocks are identical *and* they were
hashed under the same tenant key: identical prompts of two tenants never
produce the same key (short of an HMAC forgery). Digests are truncated to
``digest_size`` bytes (default 16 = 128 bits; collisions are negligible at any
realistic index size).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import Any

__all__ = ["block_hash_chain", "DEFAULT_DIGEST_SIZE", "hmac_sha256"]

DEFAULT_DIGEST_SIZE = 16
_DOMAIN = b"pg-prefix-v1"
_SHA256_BLOCK = 64
_IPAD = bytes(x ^ 0x36 for x in range(256))
_OPAD = bytes(x ^ 0x5C for x in range(256))


#: most keys whose HMAC pad states :func:`_pad_states` keeps (emptied when full)
PAD_STATES_MAX = 1024
_pads: dict[bytes, tuple[Any, Any]] = {}


def _pad_states(key: bytes) -> tuple[Any, Any]:
    """The SHA-256 states after HMAC's inner and outer padded key blocks (RFC 2104), kept per key
    (issue 14, session 7: two hash objects and two compressions per request saved; callers only
    ``copy()`` them). The memo holds the tenant keys' pad states in process memory, as the key
    ring holds the keys; a rotated key's stay until the memo is emptied."""
    got = _pads.get(key)
    if got is None:
        padded = (hashlib.sha256(key).digest() if len(key) > _SHA256_BLOCK else key).ljust(_SHA256_BLOCK, b"\0")
        got = (hashlib.sha256(padded.translate(_IPAD)), hashlib.sha256(padded.translate(_OPAD)))
        if len(_pads) >= PAD_STATES_MAX:
            _pads.clear()
        _pads[key] = got
    return got


def hmac_sha256(key: bytes, msg: bytes) -> bytes:
    """``hmac.new(key, msg, sha256).digest()`` from two one-shot SHA-256 calls (no HMAC object:
    ~40 % less here, issue 14); for a key used once (not memoised, unlike :func:`_pad_states`)."""
    padded = (hashlib.sha256(key).digest() if len(key) > _SHA256_BLOCK else key).ljust(_SHA256_BLOCK, b"\0")
    return hashlib.sha256(padded.translate(_OPAD) + hashlib.sha256(padded.translate(_IPAD) + msg).digest()).digest()


def block_hash_chain(
    key: bytes,
    tokens: Sequence[int],
    block_size: int,
    *,
    key_id: str = "",
    digest_size: int = DEFAULT_DIGEST_SIZE,
    max_blocks: int | None = None,
) -> list[bytes]:
    """Return the keyed hash chain ``[h_1 … h_n]`` of the full blocks of ``tokens``.

    ``key`` is the tenant's secret prefix key (bytes, at least 16),
    ``block_size`` is in tokens, ``key_id`` is mixed into the seed so chains
    of different key versions never collide, ``max_blocks`` bounds the work
    for very long prompts. Raises :class:`ValueError` for a short key, a
    non-positive block size or a digest size outside 8..32 bytes, and
    :class:`struct.error` for a token id outside 0..2**32-1.
    """
    if len(key) < 16:
        raise ValueError("prefix key must be at least 16 bytes")
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    if not 8 <= digest_size <= 32:
        raise ValueError("digest_size must be within 8..32 bytes")
    n = len(tokens) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    if n <= 0:
        return []
    # all ids packed by one C call, then sliced per block (session 3: no per-block pack)
    width = 4 * block_size
    packed = struct.pack(f">{n * block_size}I", *tokens[: n * block_size])
    # HMAC-SHA256 (RFC 2104) from two SHA-256 states prepared once per call: each block costs two
    # state copies and digests, ~2x faster than copying an ``hmac.HMAC`` (OpenSSL context) per
    # block; byte-identical to ``hmac.new(key, msg, sha256)`` (tests/tenancy/test_s3_prefix_chain_fast.py)
    inner, outer = _pads.get(key) or _pad_states(key)  # a memo hit without the call (s18)
    prev = _DOMAIN + key_id.encode("utf-8")
    out: list[bytes] = []
    append = out.append
    for start in range(0, n * width, width):
        h = inner.copy()
        h.update(prev)
        h.update(packed[start : start + width])
        o = outer.copy()
        o.update(h.digest())
        prev = o.digest()[:digest_size]
        append(prev)
    return out
