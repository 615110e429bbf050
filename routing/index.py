"""Approximate per-replica prefix index learned from the router's own decisions.

The gateway cannot see the replicas' KV caches, so it remembers which prefix
block keys it has sent to each replica and assumes they are still cached.
Block keys come from :func:`tenancy.prefix.block_hash_chain`: a keyed hash
chain, so key ``h_i`` stands for the whole prefix ``block_1 … block_i`` and a
replica "holds" a prefix of ``k`` blocks iff it holds ``h_1 … h_k``.

Memory is bounded the way the replica's cache is bounded: one LRU per replica
of ``capacity_blocks`` KV blocks (default 4000, the simulator's and a typical
vLLM replica's order of magnitude). :meth:`InProcessPrefixIndex.record` touches a
request's blocks deepest-first so that the request's *first* block ends up
most recently used; the oldest conversation tails are evicted before shared
heads, which mirrors vLLM's free-block queue (a freed request's blocks are
appended in reverse order, so prefix roots are evicted last).

Tenant isolation and key-version isolation come from the keys themselves:
every tenant and every key version (key id) seeds its own HMAC chain, so two
tenants or two key versions never produce the same key and can never match
each other's entries.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["PrefixIndex", "InProcessPrefixIndex", "IndexStats", "DEFAULT_CAPACITY_BLOCKS"]

DEFAULT_CAPACITY_BLOCKS = 4000

F = TypeVar("F", bound=Callable[..., Any])


def _queued_first(method: F, name: str | None = None) -> F:
    """The one rule of :meth:`InProcessPrefixIndex.record_later` for every method that reads or changes the
    index: the records queued are applied first, in call order (session 16: it was the first two lines of
    each such method). :meth:`InProcessPrefixIndex.match_many`, the one on the request's path, runs the
    same test inline instead of through this wrapper's extra call (tests/routing/test_s16_fixes_index.py
    checks every public method of the index either way). ``name``: the public name when it is not the
    method's own (``record`` wraps ``_record``)."""

    @functools.wraps(method)
    def applied(self: InProcessPrefixIndex, *args: Any, **kwargs: Any) -> Any:
        if self._later:
            self.flush()
        return method(self, *args, **kwargs)

    if name is not None:
        applied.__name__ = name
        applied.__qualname__ = applied.__qualname__.rsplit(".", 1)[0] + "." + name
    return applied  # type: ignore[return-value]


@dataclass(frozen=True)
class IndexStats:
    """Index counters: ``replicas`` tracked, ``blocks`` (entries summed over
    replicas), ``distinct_keys`` (distinct block keys), ``evictions`` (LRU
    evictions since start), ``capacity_blocks`` (per replica)."""

    replicas: int
    blocks: int
    distinct_keys: int
    evictions: int
    capacity_blocks: int


@runtime_checkable
class PrefixIndex(Protocol):
    """The router's view of which prefix blocks each replica holds.

    State that several gateway instances will share: the in-process
    :class:`InProcessPrefixIndex` is the default; a shared implementation
    (e.g. Redis-backed) is fed from outside and keeps these calls local and
    synchronous (the router never waits on I/O).
    """

    @property
    def capacity_blocks(self) -> int:
        """Per-replica capacity, in KV blocks."""
        ...

    def match(self, replica_id: str, keys: Sequence[bytes]) -> int:
        """Leading blocks of ``keys`` believed cached on ``replica_id``."""
        ...

    def match_many(self, keys: Sequence[bytes], replica_ids: Iterable[str]) -> dict[str, int]:
        """Leading matched blocks of ``keys`` for every id in ``replica_ids``."""
        ...

    def record(self, replica_id: str, keys: Sequence[bytes]) -> None:
        """``keys`` (one request's chain) were sent to ``replica_id``."""
        ...

    def forget_replica(self, replica_id: str) -> None:
        """``replica_id`` lost its cache: drop what is known of it."""
        ...

    def replica_blocks(self, replica_id: str) -> int:
        """Blocks currently attributed to ``replica_id``."""
        ...

    def stats(self) -> IndexStats:
        """Snapshot of the index counters."""
        ...


class InProcessPrefixIndex:
    """Per-replica LRU sets of prefix block keys plus a key → replicas map.

    ``capacity_blocks`` is the number of KV blocks assumed cached per replica
    (raises :class:`ValueError` if not positive). Not thread-safe: use it from
    one event loop.
    """

    def __init__(self, capacity_blocks: int = DEFAULT_CAPACITY_BLOCKS) -> None:
        if capacity_blocks <= 0:
            raise ValueError("capacity_blocks must be positive")
        self._capacity = capacity_blocks
        self._lru: dict[str, OrderedDict[bytes, None]] = {}
        self._owners: dict[bytes, set[str]] = {}
        self._evictions = 0
        self._later: list[tuple[str, Sequence[bytes]]] = []  # :meth:`record_later`'s, in call order

    def record_later(self, replica_id: str, keys: Sequence[bytes]) -> None:
        """:meth:`record` ``keys`` on ``replica_id``, applied by :meth:`flush` or before any other call of
        this index reads or changes it (every method but this one applies them first, in call order:
        :func:`_queued_first`), so
        every caller sees exactly the state an immediate :meth:`record` would give (issue 14, session 15:
        the router's decision does not need its own record; the gateway applies it while the replica
        works). ``keys`` must not change afterwards (the request's chain: an immutable sequence or a
        list no one mutates). Same errors as :meth:`record` (none)."""
        self._later.append((replica_id, keys))

    def flush(self) -> None:
        """Apply the records :meth:`record_later` queued, in call order (cheap when there are none)."""
        later = self._later
        if later:
            self._later = []
            for rid, keys in later:
                self._record(rid, keys)

    @property
    def capacity_blocks(self) -> int:
        """Per-replica capacity, in KV blocks."""
        return self._capacity

    @_queued_first
    def match(self, replica_id: str, keys: Sequence[bytes]) -> int:
        """Number of leading blocks of ``keys`` believed cached on ``replica_id``
        (0 for an unknown replica). Does not change LRU order."""
        lru = self._lru.get(replica_id)
        if not lru:
            return 0
        n = 0
        for k in keys:
            if k not in lru:
                break
            n += 1
        return n

    def match_many(self, keys: Sequence[bytes], replica_ids: Iterable[str]) -> dict[str, int]:
        """Leading matched blocks of ``keys`` for every id in ``replica_ids``.

        Walks the chain once through the key → replicas map, narrowing the set
        of replicas still matching, so a miss on block 0 costs one dict lookup
        and the total cost is O(matched depth × replicas). Returns a dict with
        one entry per requested replica id (0 where nothing matches).
        """
        if self._later:  # _queued_first's rule, inline: this method is on every request's path (no wrapper call)
            self.flush()
        result = dict.fromkeys(replica_ids, 0)  # {rid: 0 for rid in replica_ids}, no comprehension frame
        alive = set(result)
        depth = 0
        for k in keys:
            owners = self._owners.get(k)
            if not owners:
                break
            still = alive & owners
            for rid in alive - still:
                result[rid] = depth
            alive = still
            if not alive:
                break
            depth += 1
        for rid in alive:
            result[rid] = depth
        return result

    def _record(self, replica_id: str, keys: Sequence[bytes]) -> None:
        """Insert or touch ``keys`` (one request's chain) on ``replica_id``.

        Keys are touched deepest-first so the chain's root is most recently
        used; least recently used keys beyond ``capacity_blocks`` are evicted.
        A chain longer than the capacity keeps only its leading blocks.
        """
        lru = self._lru.get(replica_id)
        if lru is None:
            lru = self._lru[replica_id] = OrderedDict()
        cap = self._capacity
        owners_of = self._owners
        for k in reversed(keys[:cap]):
            if k in lru:
                lru.move_to_end(k)
            else:
                lru[k] = None
                owners = owners_of.get(k)
                if owners is None:
                    owners_of[k] = {replica_id}
                else:
                    owners.add(replica_id)
        while len(lru) > cap:
            old, _ = lru.popitem(last=False)
            owners = owners_of.get(old)  # _drop_owner, inline (a few evictions per request when full)
            if owners is not None:
                owners.discard(replica_id)
                if not owners:
                    del owners_of[old]
            self._evictions += 1

    #: :meth:`_record` with the queued records applied first (one frame, as before: the wrapper calls the body
    #: directly; the shared mode's record, routing/shared.py, runs it per request)
    record = _queued_first(_record, "record")

    @_queued_first
    def forget_replica(self, replica_id: str) -> None:
        """Drop everything known about ``replica_id`` (its cache was lost,
        e.g. the replica restarted with a new instance id, or it was removed)."""
        lru = self._lru.pop(replica_id, None)
        if not lru:
            return
        for k in lru:
            self._drop_owner(k, replica_id)

    @_queued_first
    def replica_blocks(self, replica_id: str) -> int:
        """Number of blocks currently attributed to ``replica_id``."""
        lru = self._lru.get(replica_id)
        return len(lru) if lru else 0

    @_queued_first
    def stats(self) -> IndexStats:
        """Snapshot of the index counters (see :class:`IndexStats`)."""
        return IndexStats(
            replicas=len(self._lru),
            blocks=sum(len(v) for v in self._lru.values()),
            distinct_keys=len(self._owners),
            evictions=self._evictions,
            capacity_blocks=self._capacity,
        )

    def _drop_owner(self, key: bytes, replica_id: str) -> None:
        owners = self._owners.get(key)
        if owners is None:
            return
        owners.discard(replica_id)
        if not owners:
            del self._owners[key]
