"""One rule for the audit formatters' caches of values that repeat from event to event (audit/cef.py,
audit/ocsf.py; session 28): a plain dict, emptied whole when it holds ``max_entries``, so a tenant that
varies a cached value per request (its client address, its SPIFFE ID) costs misses, never memory
beyond ``max_entries`` entries per cache (S28-final28-2)."""

from __future__ import annotations

from typing import TypeVar

__all__ = ["remember"]

K = TypeVar("K")
V = TypeVar("V")


def remember(cache: dict[K, V], key: K, value: V, max_entries: int) -> V:
    """Store ``value`` under ``key`` in ``cache`` (emptied first when it holds ``max_entries`` or more)
    and return ``value``. Never raises for hashable keys."""
    if len(cache) >= max_entries:
        cache.clear()
    cache[key] = value
    return value
