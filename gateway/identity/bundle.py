"""SPIFFE trust bundles (JWT authorities) and where they come from.

A SPIFFE bundle is a JWK Set (RFC 7517 section 5) with two extra members
(SPIFFE Trust Domain and Bundle spec, section 4):

* ``spiffe_sequence`` (integer): bumped by the publisher on every change; a
  consumer never goes back to a lower sequence;
* ``spiffe_refresh_hint`` (seconds): how often a consumer should re-fetch.

Each key carries ``use``: ``"jwt-svid"`` keys verify JWT-SVIDs and MUST have a
``kid``; ``"x509-svid"`` keys are X.509 authorities and are ignored here.

The JWK Set is parsed here rather than with ``jwt.PyJWKClient`` /
``jwt.PyJWKSet`` on purpose (PyJWT 2.15): ``PyJWKClient`` keeps only keys
whose ``use`` is ``"sig"`` or absent, so it silently drops every key of a
SPIFFE bundle, and ``PyJWKSet`` silently skips keys it cannot build. Keys are
still built with ``jwt.PyJWK``. Since PyJWT 2.13 a ``PyJWK`` is bound to one
algorithm (the key's ``alg``, or a default derived from ``kty``/``crv``), so
:meth:`BundleKey.pyjwk_for` builds one per (key, token algorithm) after checking
that the algorithm belongs to the key's family.

Sources (file, HTTPS) keep the last good bundle, honour ``spiffe_sequence``
and ``spiffe_refresh_hint``, and fail closed (:class:`BundleUnavailable`)
once a bundle is older than its staleness bound.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import math
import os
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import jwt
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from .spiffe_id import parse_trust_domain

log = logging.getLogger(__name__)

#: JWS algorithms a JWT-SVID may use (JWT-SVID spec section 3, asymmetric only).
ALLOWED_ALGORITHMS: frozenset[str] = frozenset(
    {"RS256", "RS384", "RS512", "ES256", "ES384", "ES512", "PS256", "PS384", "PS512"}
)
_RSA_ALGS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
_EC_ALG_BY_CURVE = {"P-256": "ES256", "P-384": "ES384", "P-521": "ES512"}
#: JWK members that only a private key has (RFC 7518 section 6).
_PRIVATE_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})
#: Smallest RSA modulus accepted, in bits (NIST SP 800-57 / RFC 7518 3.3).
MIN_RSA_BITS = 2048
#: Largest bundle document accepted, in bytes.
MAX_BUNDLE_BYTES = 1 << 20
USE_JWT_SVID = "jwt-svid"


class BundleError(Exception):
    """A bundle document is unusable (not JSON, wrong shape, duplicate kid)."""


class BundleUnavailable(BundleError):
    """No bundle can be served for a trust domain: never loaded, or the last
    good one is older than the source's staleness bound (fail closed)."""


class UnknownTrustDomain(BundleError):
    """No bundle source is configured for the trust domain."""


class KeyAlgorithmMismatch(BundleError):
    """The token's ``alg`` is not one the bundle key may verify."""


@dataclass(frozen=True, slots=True)
class BundleKey:
    """One JWT-SVID signing authority of a bundle.

    ``kid``: key id; ``kty``: ``"RSA"`` or ``"EC"``; ``crv``: EC curve name or
    ``None``; ``alg``: the JWK's declared algorithm or ``None``; ``jwk``: the
    public JWK members (read-only).
    """

    kid: str
    kty: str
    crv: str | None
    alg: str | None
    jwk: Mapping[str, Any]
    _cache: dict[str, jwt.PyJWK] = field(default_factory=dict, compare=False, repr=False)

    def algorithms(self) -> frozenset[str]:
        """The JWS algorithms this key may verify (subset of ALLOWED_ALGORITHMS)."""
        if self.alg is not None:
            return frozenset({self.alg})
        if self.kty == "RSA":
            return _RSA_ALGS
        return frozenset({_EC_ALG_BY_CURVE[self.crv or ""]})

    def pyjwk_for(self, alg: str) -> jwt.PyJWK:
        """A ``jwt.PyJWK`` bound to ``alg``.

        Raises :class:`KeyAlgorithmMismatch` if ``alg`` is not allowed or not
        of this key's family (e.g. ``ES256`` for an RSA key, ``ES384`` for a
        P-256 key, anything but the JWK's own ``alg`` when it declares one).
        """
        if alg not in ALLOWED_ALGORITHMS or alg not in self.algorithms():
            raise KeyAlgorithmMismatch(f"key {self.kid!r} may not verify alg {alg!r}")
        got = self._cache.get(alg)
        if got is None:
            got = jwt.PyJWK(dict(self.jwk), algorithm=alg)
            self._cache[alg] = got
        return got


@dataclass(frozen=True, slots=True)
class TrustBundle:
    """The JWT authorities of one trust domain.

    ``keys``: kid -> :class:`BundleKey`; ``sequence``: ``spiffe_sequence`` or
    ``None``; ``refresh_hint_s``: ``spiffe_refresh_hint`` in seconds or
    ``None``; ``skipped``: number of keys ignored (other ``use``, bad key).
    """

    trust_domain: str
    keys: Mapping[str, BundleKey]
    sequence: int | None = None
    refresh_hint_s: float | None = None
    skipped: int = 0

    def get(self, kid: str) -> BundleKey | None:
        """The key with this kid, or ``None``."""
        return self.keys.get(kid)


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise BundleError(f"duplicate JSON member {k!r}")
        out[k] = v
    return out


def _parse_key(raw: Any, allow_missing_use: bool) -> BundleKey | None:
    """Validate one JWK; ``None`` means "ignore this key" (logged by caller)."""
    if not isinstance(raw, dict):
        return None
    use = raw.get("use")
    if use is None:
        if not allow_missing_use:
            return None
    elif use != USE_JWT_SVID:
        return None
    kid = raw.get("kid")
    if not isinstance(kid, str) or not kid:
        return None
    if _PRIVATE_MEMBERS & raw.keys():
        log.warning("bundle key %r carries private key material; ignored", kid)
        return None
    kty = raw.get("kty")
    crv = raw.get("crv")
    alg = raw.get("alg")
    if kty == "RSA":
        crv = None
    elif kty == "EC":
        if crv not in _EC_ALG_BY_CURVE:
            return None
    else:
        return None  # oct (symmetric), OKP and unknown types are never trusted
    if alg is not None:
        if alg not in ALLOWED_ALGORITHMS:
            return None
        if kty == "RSA" and alg not in _RSA_ALGS:
            return None
        if kty == "EC" and alg != _EC_ALG_BY_CURVE[crv]:
            return None
    public = {k: v for k, v in raw.items()}
    key = BundleKey(kid=kid, kty=kty, crv=crv, alg=alg, jwk=MappingProxyType(public))
    try:
        probe = key.pyjwk_for(next(iter(sorted(key.algorithms()))))
    except (jwt.PyJWTError, KeyAlgorithmMismatch, ValueError, TypeError):
        return None
    if isinstance(probe.key, rsa.RSAPublicKey):
        if probe.key.key_size < MIN_RSA_BITS:
            return None
    elif not isinstance(probe.key, ec.EllipticCurvePublicKey):
        return None
    return key


def parse_bundle(
    trust_domain: str,
    document: bytes | str | Mapping[str, Any],
    *,
    allow_missing_use: bool = False,
) -> TrustBundle:
    """Parse a SPIFFE bundle (or plain JWKS) document into a :class:`TrustBundle`.

    ``document``: JSON bytes/str (at most 1 MiB) or an already-decoded object.
    Keeps keys with ``use == "jwt-svid"``; keys without ``use`` are kept only
    when ``allow_missing_use`` is true (for plain JWKS issuers that are not
    SPIFFE-aware). Every kept key must have a non-empty ``kid``, be an RSA
    (>= 2048 bits) or EC P-256/P-384/P-521 public key, carry no private
    members, and any declared ``alg`` must be in :data:`ALLOWED_ALGORITHMS` and
    fit the key. Other keys are ignored and counted in ``skipped``.

    Raises :class:`BundleError` when the document is not a JSON object with a
    ``keys`` array, has duplicate JSON members, two kept keys share a kid, or
    ``spiffe_sequence``/``spiffe_refresh_hint`` are of the wrong type.
    """
    parse_trust_domain(trust_domain)
    if isinstance(document, (bytes, str)):
        raw_bytes = document.encode() if isinstance(document, str) else document
        if len(raw_bytes) > MAX_BUNDLE_BYTES:
            raise BundleError("bundle document larger than 1 MiB")
        try:
            obj = json.loads(raw_bytes, object_pairs_hook=_reject_duplicates)
        except (ValueError, RecursionError) as e:
            raise BundleError(f"bundle is not valid JSON: {e}") from e
    else:
        obj = dict(document)
    if not isinstance(obj, dict) or not isinstance(obj.get("keys"), list):
        raise BundleError("bundle must be a JSON object with a 'keys' array")
    seq = obj.get("spiffe_sequence")
    if seq is not None and (isinstance(seq, bool) or not isinstance(seq, int) or seq < 0):
        raise BundleError("spiffe_sequence must be a non-negative integer")
    hint = obj.get("spiffe_refresh_hint")
    if hint is not None:
        if isinstance(hint, bool) or not isinstance(hint, (int, float)) or not math.isfinite(hint) or hint < 0:
            raise BundleError("spiffe_refresh_hint must be a non-negative number of seconds")
        hint = float(hint)
    keys: dict[str, BundleKey] = {}
    skipped = 0
    for raw in obj["keys"]:
        key = _parse_key(raw, allow_missing_use)
        if key is None:
            skipped += 1
            continue
        if key.kid in keys:
            raise BundleError(f"two JWT-SVID keys share kid {key.kid!r}")
        keys[key.kid] = key
    return TrustBundle(
        trust_domain=trust_domain,
        keys=MappingProxyType(keys),
        sequence=seq,
        refresh_hint_s=hint,
        skipped=skipped,
    )


class TrustBundleSource(abc.ABC):
    """Where one trust domain's bundle comes from.

    Subclasses implement :meth:`_refresh_due` and :meth:`_load`; the base keeps
    the last good bundle, refuses ``spiffe_sequence`` regressions (a bundle
    with a lower sequence than the current one is ignored; a bundle without a
    sequence is accepted), and fails closed after ``max_stale_s`` seconds
    without a successful refresh. ``clock`` is monotonic seconds.

    Change signal: :attr:`generation` counts the accepted bundles whose keys
    differ from the previous one (a key added, removed or replaced; a new
    ``spiffe_sequence`` with the same keys is not a change); listeners
    registered with :meth:`add_listener` are called synchronously with
    ``(trust_domain, generation)`` right after such a change. Anything that
    remembers a verification result (the verified-token cache) keys it on
    the generation it was verified under.
    """

    def __init__(
        self,
        trust_domain: str,
        *,
        max_stale_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.trust_domain = parse_trust_domain(trust_domain)
        self.max_stale_s = max_stale_s
        self._clock = clock
        self._bundle: TrustBundle | None = None
        self._last_ok: float | None = None
        self._last_attempt: float = -math.inf
        self._lock = asyncio.Lock()
        self._generation = 0
        self._listeners: list[Callable[[str, int], None]] = []

    @property
    def generation(self) -> int:
        """How many times the set of keys changed (0 before the first bundle)."""
        return self._generation

    def add_listener(self, callback: Callable[[str, int], None]) -> None:
        """Call ``callback(trust_domain, generation)`` after every key change.

        Called synchronously from the refresh (or :meth:`StaticBundleSource.replace`);
        a callback must be quick and must not raise (an exception is logged
        and ignored so that one listener cannot stop a rotation).
        """
        self._listeners.append(callback)

    def current(self) -> TrustBundle | None:
        """The last accepted bundle without any refresh (may be stale)."""
        return self._bundle

    def _accept(self, bundle: TrustBundle) -> None:
        cur = self._bundle
        if (
            cur is not None
            and cur.sequence is not None
            and bundle.sequence is not None
            and bundle.sequence < cur.sequence
        ):
            log.warning(
                "trust domain %s: ignoring bundle with spiffe_sequence %d < current %d",
                self.trust_domain, bundle.sequence, cur.sequence,
            )
        else:
            if cur is None or set(cur.keys) != set(bundle.keys):
                log.info(
                    "trust domain %s: bundle keys now %s (sequence %s)",
                    self.trust_domain, sorted(bundle.keys), bundle.sequence,
                )
            changed = cur is None or dict(cur.keys) != dict(bundle.keys)
            self._bundle = bundle
            if changed:
                self._generation += 1
                for callback in list(self._listeners):
                    try:
                        callback(self.trust_domain, self._generation)
                    except Exception:  # a listener must never stop a rotation
                        log.exception("trust domain %s: bundle change listener failed", self.trust_domain)
        self._last_ok = self._clock()

    @abc.abstractmethod
    def _refresh_due(self, now: float) -> bool:
        """True when a refresh should be attempted now."""

    @abc.abstractmethod
    async def _load(self, now: float) -> TrustBundle | None:
        """Fetch/read the bundle; ``None`` means "unchanged". Raise on failure."""

    def _serve(self, now: float) -> TrustBundle:
        if self._bundle is None or self._last_ok is None:
            raise BundleUnavailable(f"no trust bundle loaded for {self.trust_domain}")
        if now - self._last_ok > self.max_stale_s:
            raise BundleUnavailable(
                f"trust bundle for {self.trust_domain} is stale "
                f"({now - self._last_ok:.0f} s > {self.max_stale_s:.0f} s)"
            )
        return self._bundle

    async def refresh(self, *, only_if_due: bool = False, min_gap_s: float = 0.0) -> TrustBundle:
        """Refresh now and return the bundle to use (single-flight).

        Concurrent callers queue on one lock and re-check under it, so a burst
        of requests causes one load: with ``only_if_due`` nothing is loaded if
        another caller already refreshed; with ``min_gap_s`` nothing is loaded
        if the last attempt is more recent than that many seconds.
        Raises :class:`BundleUnavailable` when nothing usable is held.
        """
        async with self._lock:
            now = self._clock()
            if self._bundle is not None:
                if only_if_due and not self._refresh_due(now):
                    return self._serve(now)
                if now - self._last_attempt < min_gap_s:
                    return self._serve(now)
            self._last_attempt = now
            try:
                got = await self._load(now)
            except (OSError, BundleError, aiohttp.ClientError, asyncio.TimeoutError, ValueError) as e:
                log.warning("trust domain %s: bundle refresh failed: %s", self.trust_domain, e)
                self._on_failure(now)
            else:
                if got is None:
                    self._last_ok = now
                else:
                    self._accept(got)
                self._on_success(now)
            return self._serve(self._clock())

    def _on_success(self, now: float) -> None:
        """Hook: schedule the next refresh after a success."""

    def _on_failure(self, now: float) -> None:
        """Hook: schedule the next retry after a failure."""

    async def get(self) -> TrustBundle:
        """The bundle to verify with, refreshed if due.

        Raises :class:`BundleUnavailable` (fail closed) when none is usable.
        """
        now = self._clock()
        if self._bundle is None or self._refresh_due(now):
            return await self.refresh(only_if_due=True)
        return self._serve(now)

    async def refresh_for_unknown_kid(self) -> TrustBundle:
        """Called when a token names a kid the bundle lacks (a rotation may
        have happened). Default: same as :meth:`get`."""
        return await self.get()

    async def aclose(self) -> None:
        """Release network resources (no-op by default)."""


class StaticBundleSource(TrustBundleSource):
    """A fixed in-memory bundle (tests, pinned configuration). Never stale."""

    def __init__(self, bundle: TrustBundle) -> None:
        super().__init__(bundle.trust_domain, max_stale_s=math.inf)
        self._accept(bundle)

    def replace(self, bundle: TrustBundle) -> None:
        """Swap in a new bundle (sequence regressions are still refused)."""
        self._accept(bundle)

    def _refresh_due(self, now: float) -> bool:
        return False

    async def _load(self, now: float) -> TrustBundle | None:
        return None


class FileBundleSource(TrustBundleSource):
    """A bundle read from a local file (e.g. written by SPIRE agent or the demo issuer).

    The file is stat'ed at most every ``check_interval_s`` seconds and re-read
    only when its (mtime_ns, size, inode) changes. A missing or broken file
    keeps the last good bundle for ``max_stale_s`` seconds, then fails closed.
    """

    def __init__(
        self,
        trust_domain: str,
        path: str | os.PathLike[str],
        *,
        check_interval_s: float = 1.0,
        max_stale_s: float = 300.0,
        allow_missing_use: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(trust_domain, max_stale_s=max_stale_s, clock=clock)
        self.path = Path(path)
        self.check_interval_s = check_interval_s
        self.allow_missing_use = allow_missing_use
        self._stamp: tuple[int, int, int] | None = None
        self._checked_at: float | None = None

    def _refresh_due(self, now: float) -> bool:
        return self._checked_at is None or now - self._checked_at >= self.check_interval_s

    async def _load(self, now: float) -> TrustBundle | None:
        self._checked_at = now
        st = self.path.stat()
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
        if stamp == self._stamp and self._bundle is not None:
            return None
        if st.st_size > MAX_BUNDLE_BYTES:
            raise BundleError("bundle file larger than 1 MiB")
        bundle = parse_bundle(
            self.trust_domain, self.path.read_bytes(), allow_missing_use=self.allow_missing_use
        )
        self._stamp = stamp
        return bundle


class HttpsBundleSource(TrustBundleSource):
    """A bundle fetched from a SPIFFE bundle endpoint (``https_web`` profile).

    Fetched with aiohttp, TLS verified against ``ssl_context`` (system roots by
    default); redirects are not followed; the body is bounded to 1 MiB. The
    next refresh is ``spiffe_refresh_hint`` (or ``default_refresh_s``) clamped
    to [``min_refresh_s``, ``max_refresh_s``]. After a failed fetch the last
    good bundle is served (stale-while-error) and a retry is scheduled after
    ``retry_s``; once ``max_stale_s`` seconds pass since the last success,
    :class:`BundleUnavailable` is raised (fail closed). A token with an
    unknown kid triggers at most one early refresh per ``min_refresh_s``.

    ``http://`` URLs are refused unless ``insecure_http_for_tests`` is set.
    Raises ``ValueError`` for a bad URL at construction.
    """

    def __init__(
        self,
        trust_domain: str,
        url: str,
        *,
        default_refresh_s: float = 300.0,
        min_refresh_s: float = 5.0,
        max_refresh_s: float = 3600.0,
        retry_s: float = 5.0,
        max_stale_s: float = 3600.0,
        timeout_s: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        allow_missing_use: bool = False,
        insecure_http_for_tests: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(trust_domain, max_stale_s=max_stale_s, clock=clock)
        parts = urlsplit(url)
        if parts.scheme != "https" and not (insecure_http_for_tests and parts.scheme == "http"):
            raise ValueError("bundle endpoint URL must use https")
        if not parts.hostname:
            raise ValueError("bundle endpoint URL has no host")
        self.url = url
        self.default_refresh_s = default_refresh_s
        self.min_refresh_s = min_refresh_s
        self.max_refresh_s = max_refresh_s
        self.retry_s = retry_s
        self.timeout_s = timeout_s
        self.allow_missing_use = allow_missing_use
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self._session: aiohttp.ClientSession | None = None
        self._next_refresh: float = -math.inf

    def _refresh_due(self, now: float) -> bool:
        return now >= self._next_refresh

    def _on_success(self, now: float) -> None:
        hint = self._bundle.refresh_hint_s if self._bundle is not None else None
        period = self.default_refresh_s if not hint else hint
        self._next_refresh = now + min(max(period, self.min_refresh_s), self.max_refresh_s)

    def _on_failure(self, now: float) -> None:
        self._next_refresh = now + self.retry_s

    async def _load(self, now: float) -> TrustBundle | None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        async with self._session.get(
            self.url, ssl=self._ssl, allow_redirects=False,
            headers={"Accept": "application/json"},
        ) as resp:
            if resp.status != 200:
                raise BundleError(f"bundle endpoint answered HTTP {resp.status}")
            body = await resp.content.read(MAX_BUNDLE_BYTES + 1)
        if len(body) > MAX_BUNDLE_BYTES:
            raise BundleError("bundle document larger than 1 MiB")
        return parse_bundle(self.trust_domain, body, allow_missing_use=self.allow_missing_use)

    async def refresh_for_unknown_kid(self) -> TrustBundle:
        """Refresh early, at most once per ``min_refresh_s``, else serve as usual.

        Goes through the refresh lock so that requests arriving while an early
        refresh is in flight wait for its result instead of failing.
        """
        return await self.refresh(min_gap_s=self.min_refresh_s)

    async def aclose(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


class TrustBundleStore:
    """Trust domain name -> :class:`TrustBundleSource`.

    ``get(td)`` raises :class:`UnknownTrustDomain` for an unconfigured domain
    and :class:`BundleUnavailable` when its source has nothing usable.
    """

    def __init__(self, sources: Mapping[str, TrustBundleSource] | None = None) -> None:
        self._sources: dict[str, TrustBundleSource] = {}
        self._listeners: list[Callable[[str, int], None]] = []
        self._epochs: dict[str, int] = {}
        for td, src in (sources or {}).items():
            if td != src.trust_domain:
                raise ValueError(f"source for {src.trust_domain!r} registered under {td!r}")
            self.add(src)

    def add(self, source: TrustBundleSource) -> None:
        """Register (or replace) the source of ``source.trust_domain``.

        Store listeners (:meth:`add_listener`) are attached to it, and called
        once now: a replaced source is a changed bundle."""
        old = self._sources.get(source.trust_domain)
        self._sources[source.trust_domain] = source
        self._epochs[source.trust_domain] = self._epochs.get(source.trust_domain, -1) + 1
        for callback in self._listeners:
            source.add_listener(callback)
        if old is not None and old is not source:
            for callback in self._listeners:
                callback(source.trust_domain, source.generation)

    def add_listener(self, callback: Callable[[str, int], None]) -> None:
        """Call ``callback(trust_domain, generation)`` whenever a domain's keys
        change (every current and future source; see
        :meth:`TrustBundleSource.add_listener`)."""
        self._listeners.append(callback)
        for source in self._sources.values():
            source.add_listener(callback)

    def generation(self, trust_domain: str) -> tuple[int, int]:
        """An opaque version of ``trust_domain``'s keys: (how many times its
        source was replaced, the source's :attr:`~TrustBundleSource.generation`).
        Equal values mean the same keys. Raises :class:`UnknownTrustDomain`."""
        source = self.source(trust_domain)
        return (self._epochs[trust_domain], source.generation)

    def trust_domains(self) -> frozenset[str]:
        """The configured trust domain names."""
        return frozenset(self._sources)

    def source(self, trust_domain: str) -> TrustBundleSource:
        """The source of a trust domain; raises :class:`UnknownTrustDomain`."""
        try:
            return self._sources[trust_domain]
        except KeyError:
            raise UnknownTrustDomain(f"no trust bundle configured for {trust_domain}") from None

    async def get(self, trust_domain: str) -> TrustBundle:
        """The current bundle of ``trust_domain`` (refreshed if due)."""
        return await self.source(trust_domain).get()

    async def refresh_for_unknown_kid(self, trust_domain: str) -> TrustBundle:
        """Give the domain's source a chance to pick up a rotated-in key."""
        return await self.source(trust_domain).refresh_for_unknown_kid()

    async def aclose(self) -> None:
        """Close every source."""
        for src in self._sources.values():
            await src.aclose()
