"""Block-level prefix KV cache of one simulated replica.

Models vLLM's automatic prefix caching closely enough to judge routers:

* A prompt is cut into full blocks of ``block_size`` tokens (a trailing partial
  block is never cached, as in vLLM). Block ``i`` is identified by a hash that
  covers the whole prefix up to it::

      k_0 = BLAKE2b("pg-sim-kv-v1" || salt)            (salt = request's cache_salt, or "")
      k_i = BLAKE2b(k_{i-1} || pack(">{B}I", block_i), digest_size=16)

  so two requests share block ``i`` only if their first ``i`` blocks are equal
  *and* they carry the same ``cache_salt`` (vLLM's per-tenant cache isolation
  field, see vLLM docs "Automatic Prefix Caching" / RFC #16016).
* :class:`BlockCache` holds at most ``capacity_blocks`` keys and evicts the
  least recently used. A request's blocks are touched tail-first, so within one
  prefix the deepest blocks are evicted before the shared head (vLLM frees
  blocks in reverse order for the same reason).

The cache is pure data; the replica decides when to look up (prefill start) and
when to insert (prefill end).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from cachetools import LRUCache

__all__ = ["BlockCache", "CacheStats", "block_keys", "KEY_DIGEST_SIZE"]

KEY_DIGEST_SIZE = 16
_DOMAIN = b"pg-sim-kv-v1"


def block_keys(tokens: Sequence[int], block_size: int, salt: str | None = None) -> list[bytes]:
    """Return the chained keys ``[k_1 … k_n]`` of the full blocks of ``tokens``.

    ``tokens`` are token ids (0..2**32-1), ``block_size`` is in tokens, ``salt``
    is the request's ``cache_salt`` (``None`` and ``""`` are the unsalted
    namespace). Keys are 16-byte BLAKE2b digests. Raises :class:`ValueError`
    for a non-positive block size and :class:`struct.error` for a token id
    outside the 32-bit range.
    """
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    n = len(tokens) // block_size
    if n == 0:
        return []
    pack = struct.Struct(f">{block_size}I").pack
    blake = hashlib.blake2b
    prev = blake(_DOMAIN + (salt or "").encode("utf-8"), digest_size=KEY_DIGEST_SIZE).digest()
    keys: list[bytes] = []
    append = keys.append
    for i in range(n):
        start = i * block_size
        prev = blake(prev + pack(*tokens[start : start + block_size]), digest_size=KEY_DIGEST_SIZE).digest()
        append(prev)
    return keys


@dataclass
class CacheStats:
    """Counters of a :class:`BlockCache`, all in blocks.

    ``queried_blocks``/``hit_blocks`` are summed over :meth:`BlockCache.match`
    calls (hit = leading blocks found); ``inserted_blocks`` counts blocks newly
    stored, ``evicted_blocks`` blocks dropped by LRU.
    """

    lookups: int = 0
    queried_blocks: int = 0
    hit_blocks: int = 0
    inserted_blocks: int = 0
    evicted_blocks: int = 0


class BlockCache:
    """LRU set of KV block keys with a fixed capacity (in blocks).

    ``match(keys)`` returns how many *leading* keys are cached (a prefix hit
    ends at the first missing block, because a block's KV depends on all
    earlier tokens). ``insert(keys)`` stores or refreshes keys and evicts the
    least recently used beyond capacity. Raises :class:`ValueError` for a
    negative capacity. Not thread-safe; one event loop owns it.
    """

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks < 0:
            raise ValueError("capacity_blocks must be >= 0")
        self.capacity_blocks = capacity_blocks
        self._lru: LRUCache[bytes, None] = LRUCache(maxsize=capacity_blocks)
        self.stats = CacheStats()

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: object) -> bool:
        return key in self._lru

    @property
    def usage(self) -> float:
        """Fraction of capacity in use, 0.0..1.0 (vLLM ``kv_cache_usage_perc``)."""
        return len(self._lru) / self.capacity_blocks if self.capacity_blocks else 0.0

    def match(self, keys: Sequence[bytes]) -> int:
        """Return the number of leading ``keys`` present; counts the lookup. Does not touch LRU order."""
        lru = self._lru
        hit = 0
        for k in keys:
            if k not in lru:
                break
            hit += 1
        st = self.stats
        st.lookups += 1
        st.queried_blocks += len(keys)
        st.hit_blocks += hit
        return hit

    def insert(self, keys: Sequence[bytes]) -> int:
        """Insert or touch ``keys`` (most recent = the first key); evict LRU beyond capacity.

        Only the first ``capacity_blocks`` keys are kept when a prompt is larger
        than the whole cache. Returns the number of newly stored blocks.
        """
        cap = self.capacity_blocks
        if cap == 0 or not keys:
            return 0
        lru = self._lru
        batch = keys[:cap]
        before = len(lru)
        # Touch the batch's stored keys first, so that storing a new key of the
        # batch (which evicts the least recently used) never drops one of them.
        for k in batch:
            if k in lru:
                lru[k]  # noqa: B018 - a read touches the LRU order
        new = 0
        for k in reversed(batch):
            if k not in lru:
                new += 1
            lru[k] = None  # stores or touches; the first key ends most recent
        evicted = before + new - len(lru)
        self.stats.inserted_blocks += new
        self.stats.evicted_blocks += evicted
        return new

    def clear(self) -> None:
        """Drop every block and zero the counters."""
        self._lru.clear()
        self.stats = CacheStats()
