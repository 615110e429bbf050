"""Per-source-address limits for callers not yet authenticated: :class:`SourceLimiter`
(failed-signature budget per client address) and :func:`source_key` (address normalisation).

Same token bucket as the tenant limits (:class:`tenancy.limits.TokenBucket`),
in memory, per process (a failed-authentication budget needs no sharing:
each process sees the connections it accepts).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Callable

from cachetools import LRUCache

from tenancy.limits import RateLimited, TokenBucket

__all__ = ["SourceLimiter", "source_key"]


def source_key(address: str, *, ipv6_prefix: int = 64) -> str:
    """Normalise a client address into a limiter key.

    IPv6 addresses are grouped by their ``/ipv6_prefix`` network (a host
    usually owns a whole /64, so per-address keys would be free to evade);
    IPv4-mapped IPv6 becomes plain IPv4; anything unparsable (e.g. a Unix
    socket peer) is returned unchanged.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network(f"{ip}/{ipv6_prefix}", strict=False))
    return str(ip)


class SourceLimiter:
    """Per-source-address bucket for callers not yet authenticated.

    The gateway uses it as a budget of failed JWT-SVID signature checks per
    source (``rate`` per second, ``burst``): :meth:`blocked` right before a
    signature would be checked, :meth:`charge_failure` after one failed
    (gateway/authn.py; cheap refusals and cached tokens never touch it).
    :meth:`check` is a plain request bucket (one unit per call). Memory is
    bounded: at most ``max_sources`` buckets in LRU order; an evicted source
    starts again with a full bucket (an attacker spraying many addresses can
    evict others' state, never exceed the bound).
    """

    def __init__(
        self,
        rate: float,
        burst: float,
        *,
        max_sources: int = 65536,
        clock: Callable[[], float] = time.monotonic,
        ipv6_prefix: int = 64,
    ) -> None:
        if not (rate > 0 and burst >= 1):
            raise ValueError("rate must be > 0 and burst >= 1")
        if max_sources < 1:
            raise ValueError("max_sources must be >= 1")
        self._rate = float(rate)
        self._burst = float(burst)
        self._clock = clock
        self._ipv6_prefix = ipv6_prefix
        self._buckets: LRUCache[str, TokenBucket] = LRUCache(maxsize=max_sources)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._buckets)

    def _bucket(self, key: str, now: float) -> TokenBucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = TokenBucket(self._rate, self._burst, now)
            self._buckets[key] = bucket  # evicts the least recently used source
        return bucket

    def check(self, source: str, now: float | None = None) -> None:
        """Take one request from ``source``'s bucket; raises :class:`RateLimited`
        (reason ``source_request_rate``) when it is empty."""
        key = source_key(source, ipv6_prefix=self._ipv6_prefix)
        now = self._clock() if now is None else now
        with self._lock:
            wait = self._bucket(key, now).try_take(1, now)
        if wait > 0:
            raise RateLimited(wait, "source_request_rate")

    def blocked(self, source: str, now: float | None = None) -> float:
        """Seconds until ``source`` may try to authenticate again (0.0: not blocked).

        Takes nothing. The gateway calls this right before a signature check
        and :meth:`charge_failure` after a failed one, so only failed
        signature checks consume the bucket, and a blocked source is refused
        instead of a signature check. Unknown sources are not stored.
        """
        key = source_key(source, ipv6_prefix=self._ipv6_prefix)
        now = self._clock() if now is None else now
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                return 0.0
            bucket._refill(now)
            return 0.0 if bucket.level >= 1 else (1 - bucket.level) / bucket.rate

    def charge_failure(self, source: str, now: float | None = None) -> None:
        """Record one failed authentication of ``source`` (takes one unit, never raises)."""
        key = source_key(source, ipv6_prefix=self._ipv6_prefix)
        now = self._clock() if now is None else now
        with self._lock:
            bucket = self._bucket(key, now)
            bucket._refill(now)
            bucket.level = max(bucket.level - 1, -bucket.burst)
