"""The verified-token cache: JWT-SVIDs whose signature was already checked.

The project's one positive cache of verified tokens (issue 12, finding 1).
A :class:`~gateway.identity.JwtSvidVerifier` owns one, so there is one cache
per listener and audience: a token verified for the public audience is never
found by the admin listener's verifier.

* Key: :func:`gateway.identity.canonical_token_sha256` of the compact token,
  the SHA-256 of its exact ``header.payload.`` segments and its signature
  bytes, with an ECDSA ``s`` normalised to ``min(s, n - s)``. A token and its
  high-S twin (which verifies exactly when the token does, and which anyone
  holding the token can compute) therefore share one entry instead of
  costing a second signature check and a second entry. The verifier refuses
  a signature segment that is not canonical base64url *before* the lookup,
  so no other spelling of a cached token reaches it.
* Value: the :class:`~gateway.identity.WorkloadIdentity` built from the
  verified claims, the trust domain, and the version of that domain's keys
  (:meth:`gateway.identity.TrustBundleStore.generation`) it was verified
  under. A hit under another version is a miss (and is dropped): a key
  removed or replaced in the bundle invalidates what it verified, even
  before the change listener cleared the entries.
* Lifetime: until ``min(exp + leeway_s, verified_at + max_ttl_s)`` on the
  verifier's clock (Unix seconds), per entry: :meth:`VerifiedTokenCache.get` checks it on every hit.
* Size: at most ``maxsize`` entries (a ``cachetools.FIFOCache``); when full, the oldest stored goes
  first (its ``max_ttl_s`` cap ends first). Only tokens that verified are stored, so only an
  issuer (not a caller with bad tokens) can make entries. Issue 14, session 17: a hit is one lookup
  (``Cache.__getitem__``) and the entry's checks; the ``TLRUCache`` before it cost three Python calls
  per hit for an expiry the entry's own check repeated.

The verifier still runs every check except the signature on a hit (shape,
header, trust domain, ``kid`` in the current bundle, time claims, audience),
and the caller still applies the forwarded-certificate binding.

* Spellings (issue 14, the hit path): beside the entries the cache keeps a
  memo *exact token string -> (canonical name, parsed token)* for strings
  that verified (or were found under a verified name). Parsing a token and
  naming it are pure functions of the string (and of the verifier's fixed
  configuration), so on a repeat the verifier takes both from the memo
  (:meth:`VerifiedTokenCache.spelling`) instead of decoding the token again;
  it still checks the time claims against now (session 8: from the numbers
  kept with the parsed token; audience and ``exp - iat`` passed with the
  same verifier and do not change), the bundle version and the ``kid``, and
  the entry itself (:meth:`get`) decides. The
  memo holds at most ``maxsize`` strings; when full, strings whose entry is
  gone are dropped (all of them if none is).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from cachetools import FIFOCache

from .spiffe_id import WorkloadIdentity

__all__ = ["VerifiedTokenCache"]

#: Default entry bound and lifetime cap (seconds).
DEFAULT_MAXSIZE = 10_000
DEFAULT_MAX_TTL_S = 300.0


@dataclass(frozen=True, slots=True)
class _Entry:
    identity: WorkloadIdentity
    trust_domain: str
    keys_version: Hashable
    expires_at: float


class VerifiedTokenCache:
    """Bounded, per-entry-expiring map: canonical token name -> verified identity.

    ``maxsize``: most entries held (0 disables the cache: nothing is stored);
    ``max_ttl_s``: longest an entry lives after its verification (seconds);
    ``leeway_s``: clock skew the verifier allows after ``exp`` (seconds);
    ``clock``: Unix seconds (the verifier's clock). Raises ``ValueError`` for
    a negative ``maxsize`` or a non-positive ``max_ttl_s``. Not thread-safe:
    used from the event loop only.
    """

    def __init__(
        self,
        maxsize: int = DEFAULT_MAXSIZE,
        max_ttl_s: float = DEFAULT_MAX_TTL_S,
        *,
        leeway_s: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if maxsize < 0:
            raise ValueError("maxsize must be >= 0")
        if not max_ttl_s > 0:
            raise ValueError("max_ttl_s must be > 0")
        self.maxsize = int(maxsize)
        self.max_ttl_s = float(max_ttl_s)
        self.leeway_s = float(leeway_s)
        self._clock = clock
        self._cache: FIFOCache[str, _Entry] | None = FIFOCache(maxsize=self.maxsize) if self.maxsize else None
        self.hits = 0
        self.misses = 0
        #: exact token string -> (canonical name, parsed token): see the module doc, "Spellings"
        self._spellings: dict[str, tuple[str, object]] = {}

    def __len__(self) -> int:
        """Live entries (an expired one stays until its name is stored again or it is evicted)."""
        if self._cache is None:
            return 0
        now = self._clock()
        return sum(now < e.expires_at for e in self._cache.values())

    def get(self, name: str, trust_domain: str, keys_version: Hashable) -> WorkloadIdentity | None:
        """The identity verified under ``name``, or ``None``.

        ``None`` also when the entry expired or was verified for another trust
        domain or under another version of that domain's keys (such an entry
        is dropped).
        """
        if self._cache is None:
            self.misses += 1
            return None
        try:  # one lookup (Cache.get looks up twice: __contains__, then __getitem__)
            entry = self._cache[name]
        except KeyError:  # absent
            self.misses += 1
            return None
        if entry.trust_domain != trust_domain or entry.keys_version != keys_version \
                or not self._clock() < entry.expires_at:
            self._drop(name)
            self.misses += 1
            return None
        self.hits += 1
        return entry.identity

    def spelling(self, token: str) -> tuple[str, object] | None:
        """``(canonical name, parsed token)`` memoised for the exact string ``token``, or ``None``.

        Only a memo of parsing and naming: it proves nothing by itself; the
        caller still checks the claims and bundle and asks :meth:`get`.
        """
        return self._spellings.get(token)

    def remember_spelling(self, token: str, name: str, parsed: object) -> None:
        """Memoise ``token``'s canonical ``name`` and ``parsed`` form (call only for a
        string that verified, or that was found under a verified name)."""
        if self._cache is None:
            return
        if len(self._spellings) >= self.maxsize and token not in self._spellings:
            live = self._cache
            self._spellings = {t: v for t, v in self._spellings.items() if v[0] in live}
            if len(self._spellings) >= self.maxsize:
                self._spellings.clear()
        self._spellings[token] = (name, parsed)

    def put(self, name: str, identity: WorkloadIdentity, keys_version: Hashable) -> None:
        """Remember that ``name`` verified as ``identity`` under ``keys_version``.

        The entry lives until ``min(identity.expires_at + leeway_s, now +
        max_ttl_s)``; a token without ``expires_at`` gets the cap. Nothing is
        stored when that is already past or the cache is disabled.
        """
        if self._cache is None:
            return
        now = self._clock()
        until = now + self.max_ttl_s
        if identity.expires_at is not None:
            until = min(until, identity.expires_at + self.leeway_s)
        if not now < until:
            return
        self._cache[name] = _Entry(identity, identity.trust_domain, keys_version, until)

    def clear_trust_domain(self, trust_domain: str, _generation: object = None) -> int:
        """Drop every entry of ``trust_domain`` (its keys changed); returns how many.

        Signature fits :meth:`gateway.identity.TrustBundleStore.add_listener`.
        """
        if self._cache is None:
            return 0
        doomed = []
        for k in list(self._cache.keys()):
            e = self._cache.get(k)
            if e is not None and e.trust_domain == trust_domain:
                doomed.append(k)
        for k in doomed:
            self._drop(k)
        if doomed:
            gone = set(doomed)
            self._spellings = {t: v for t, v in self._spellings.items() if v[0] not in gone}
        return len(doomed)

    def _drop(self, name: str) -> None:
        assert self._cache is not None
        try:  # absent already
            del self._cache[name]
        except KeyError:
            pass

    def clear(self) -> None:
        """Drop every entry."""
        if self._cache is not None:
            self._cache.clear()
        self._spellings.clear()
