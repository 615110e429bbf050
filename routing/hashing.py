"""Deterministic hashing helpers of the policies (no randomness, no state).

Ties are broken by a rendezvous hash of the request's own prefix, so equal
inputs give equal choices in every process and every gateway instance.
"""

from __future__ import annotations

import hashlib

from routing.types import RouteRequest

__all__ = ["hash64", "prefix_tokens", "request_point", "tiebreak"]


def hash64(*parts: bytes) -> int:
    """64-bit BLAKE2b of length-prefixed ``parts`` (unsigned int)."""
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(len(p).to_bytes(4, "big"))
        h.update(p)
    return int.from_bytes(h.digest(), "big")


def prefix_tokens(req: RouteRequest, blocks: int) -> int:
    """Tokens covered by ``blocks`` leading blocks of ``req``, clamped to
    ``[0, req.prompt_tokens]``."""
    return max(0, min(blocks * req.block_size, req.prompt_tokens))


def request_point(req: RouteRequest, skip_blocks: int) -> bytes:
    """Bytes that identify the request's "own" prefix: the key of block
    ``skip_blocks`` (a chain key, so it covers blocks 0..skip_blocks), or the
    last key of shorter prompts, or the tenant id for prompts without a full block."""
    if req.block_keys:
        return req.block_keys[min(skip_blocks, len(req.block_keys) - 1)]
    return b"tenant:" + req.tenant_id.encode("utf-8")


def tiebreak(point: bytes, replica_id: str) -> int:
    """Rendezvous-hash tie-breaker: spreads ties over replicas per request,
    deterministically."""
    return hash64(point, replica_id.encode("utf-8"))
