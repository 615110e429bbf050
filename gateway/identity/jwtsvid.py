"""JWT-SVID verification (the gateway's authentication step, PEP side).

Rules, with their sources:

* JWT-SVID spec (spiffe/spiffe standards/JWT-SVID.md) sections 2-4: ``alg``
  is one of RS/ES/PS 256/384/512; ``typ`` when present is ``JWT`` or
  ``JOSE``; ``sub`` is the SPIFFE ID; ``aud`` is required and must contain
  the validator's audience; ``exp`` is required; the signing key is looked
  up by ``kid`` in the bundle of the trust domain named by ``sub``.
* RFC 8725 (JWT BCP) 3.1-3.2: explicit algorithm allow-list, never ``none``
  or HMAC with a public key; the key decides the algorithm family.
* RFC 7515 4.1.2-4.1.6, 4.1.11: ``jku``/``x5u``/``jwk``/``x5c`` are ignored
  (never fetched nor trusted); a ``crit`` header is refused since this
  verifier understands no extension.
* RFC 7519 4.1.4-4.1.6: ``exp``/``nbf``/``iat`` with ``leeway_s`` seconds.
* RFC 6750 3: ``WWW-Authenticate: Bearer`` error responses.

Order (issue 12, finding 1): everything that needs no signature work -
shape, header, trust domain, time claims, audience, ``kid`` lookup - runs
first and may only refuse; then the verified-token cache; the signature is
checked last and only for a token not already verified
(:meth:`JwtSvidVerifier.verify`).

Extra gateway policy: tokens larger than 8 KiB are refused before parsing;
the remaining lifetime ``exp - now`` must not exceed ``max_lifetime_s``
(+ leeway) even without ``iat``, and ``exp - iat`` must not exceed
``max_lifetime_s`` when ``iat`` is present; a token must name a ``kid``.
Duplicate JSON members in header or payload are refused (RFC 7515 4).
ECDSA signatures are accepted in both the low-S and the high-S form (RFC 7518
3.4 allows both and real issuers emit both); :func:`canonical_token_sha256`
names a token so that its high-S twin has the same name.

This module's one job is the verifier (key lookup, cache, signature); the
checks that need no key are in :mod:`gateway.identity.jwtsvid_claims`, the
compact-JWS decoding in :mod:`gateway.identity.jws_compact`, and the refusal
reasons and RFC 6750 answers in :mod:`gateway.identity.bearer`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

import jwt

from .bearer import Reason, _fail
from .bundle import TrustBundleStore
from .bundle_parse import (
    BundleError,
    BundleKey,
    BundleUnavailable,
    KeyAlgorithmMismatch,
    TrustBundle,
    UnknownTrustDomain,
)
from .jws_compact import MAX_TOKEN_BYTES, _signature_len, canonical_name
from .jwtsvid_claims import ParsedToken, check_claims, parse_token, time_claims, times_ok
from .spiffe_id import WorkloadIdentity, parse_trust_domain
from .token_cache import DEFAULT_MAX_TTL_S as DEFAULT_CACHE_MAX_TTL_S
from .token_cache import DEFAULT_MAXSIZE as DEFAULT_CACHE_SIZE
from .token_cache import VerifiedTokenCache


class JwtSvidVerifier:
    """Verifies JWT-SVID bearer tokens against per-trust-domain bundles.

    ``store``: bundle sources; ``audience``: this gateway's audience (the
    token's ``aud`` must contain it); ``trust_domains``: domains whose
    workloads may authenticate (each must also have a bundle in ``store``);
    ``leeway_s``: clock skew allowed on ``exp``/``nbf``/``iat`` (seconds);
    ``max_lifetime_s``: longest accepted validity (seconds); ``clock``: Unix
    seconds. ``cache_size`` / ``cache_max_ttl_s``: bounds of this verifier's
    :class:`~gateway.identity.token_cache.VerifiedTokenCache` (entries,
    seconds; ``cache_size=0`` disables it). Raises ``ValueError`` for bad
    configuration (an empty, blank or whitespace-padded audience; no trust
    domain; a negative cache size or non-positive cache lifetime).

    Order of checks in :meth:`verify` (cheapest first; everything before the
    signature only ever *refuses*: unverified claims never accept anything):

    1. size, compact shape, canonical base64url signature segment, JSON
       header/payload, header (``crit``, ``b64``, ``typ``, ``alg``), ``sub``
       is a SPIFFE ID of a configured trust domain, ``kid`` present;
    2. time claims and audience of the (still unverified) payload;
    3. the ``kid`` in the bundle of the ``sub``'s trust domain (an unknown
       kid may trigger one early refresh of that bundle), key/alg agreement,
       signature length;
    4. the verified-token cache (a hit returns the identity verified before);
    5. ``before_signature()`` (the caller's per-source budget), then the
       signature; a success is cached.

    Refusals from steps 1-3 never cost a signature check and carry
    ``signature_checked=False``; refusals from step 5 carry ``True``.
    """

    def __init__(
        self,
        store: TrustBundleStore,
        audience: str,
        trust_domains: Iterable[str],
        leeway_s: float = 30,
        max_lifetime_s: float = 3600,
        *,
        max_token_bytes: int = MAX_TOKEN_BYTES,
        clock: Callable[[], float] = time.time,
        cache_size: int = DEFAULT_CACHE_SIZE,
        cache_max_ttl_s: float = DEFAULT_CACHE_MAX_TTL_S,
    ) -> None:
        if not isinstance(audience, str) or not audience.strip() or audience != audience.strip():
            raise ValueError("audience must be a non-empty string without surrounding whitespace")
        self.store = store
        self.audience = audience
        self.trust_domains = frozenset(parse_trust_domain(td) for td in trust_domains)
        if not self.trust_domains:
            raise ValueError("at least one trust domain must be configured")
        self.leeway_s = float(leeway_s)
        self.max_lifetime_s = float(max_lifetime_s)
        self.max_token_bytes = max_token_bytes
        self._clock = clock
        #: this verifier's (this listener's and audience's) verified-token cache
        self.cache = VerifiedTokenCache(cache_size, cache_max_ttl_s, leeway_s=self.leeway_s, clock=clock)
        store.add_listener(self.cache.clear_trust_domain)
        #: signature verifications performed (successful or not)
        self.signature_checks = 0

    # -- steps 1 and 2 (no key needed): jwtsvid_claims.parse_token / check_claims --
    def _check_claims(self, p: ParsedToken) -> float:
        """Step 2 with this verifier's clock, leeway, lifetime and audience; returns ``exp``."""
        return check_claims(p, now=self._clock(), leeway_s=self.leeway_s, max_lifetime_s=self.max_lifetime_s,
                            audience=self.audience)

    # -- step 3: the key of THAT trust domain (no signature work) --
    def _key(self, p: ParsedToken, bundle: TrustBundle) -> tuple[BundleKey, jwt.PyJWK]:
        if bundle.trust_domain != p.spiffe_id.trust_domain:
            # One domain's key never vouches for another domain's identity.
            raise _fail(Reason.UNKNOWN_KID, "no key with this kid in the token's trust domain")
        key = bundle.get(p.kid)
        if key is None:
            raise _fail(Reason.UNKNOWN_KID, "no key with this kid in the token's trust domain")
        try:
            pyjwk = key.pyjwk_for(p.alg)
        except KeyAlgorithmMismatch:
            raise _fail(Reason.ALG_NOT_ALLOWED, "alg does not match the bundle key's type") from None
        except jwt.PyJWTError:
            raise _fail(Reason.ALG_NOT_ALLOWED, "bundle key cannot verify this alg") from None
        want = _signature_len(p.alg, pyjwk)
        if want is not None and p.signature_len != want:
            raise _fail(Reason.BAD_SIGNATURE, "signature has the wrong length for this key")
        return key, pyjwk

    # -- step 5: the signature (the one costly step) --
    def _check_signature(self, p: ParsedToken, pyjwk: jwt.PyJWK) -> None:
        self.signature_checks += 1
        try:
            # PyJWS checks the signature only; claims were checked above with
            # this verifier's clock. jku/x5u/jwk/x5c headers are never read.
            jwt.PyJWS().decode_complete(p.token, key=pyjwk, algorithms=[pyjwk.algorithm_name])
        except jwt.InvalidSignatureError:
            raise _fail(Reason.BAD_SIGNATURE, "signature does not verify", signature_checked=True) from None
        except jwt.InvalidAlgorithmError:
            raise _fail(Reason.ALG_NOT_ALLOWED, "alg does not match the bundle key", signature_checked=True) from None
        except jwt.PyJWTError:
            raise _fail(Reason.MALFORMED, "token cannot be decoded", signature_checked=True) from None

    def _identity(self, p: ParsedToken, kid: str, exp: float) -> WorkloadIdentity:
        return WorkloadIdentity(
            spiffe_id=p.spiffe_id,
            trust_domain=p.spiffe_id.trust_domain,
            claims=p.claims,
            source="jwt-svid",
            kid=kid,
            expires_at=exp,
        )

    def verify_with_bundle(self, token: str, bundle: TrustBundle) -> WorkloadIdentity:
        """Verify ``token`` against one given bundle (synchronous; tests, tools).

        Same checks as :meth:`verify` but without the verified-token cache.
        Returns the :class:`WorkloadIdentity`; raises :class:`AuthenticationError`.
        The bundle must belong to the token's trust domain (else ``unknown_kid``).
        """
        p = parse_token(token, max_token_bytes=self.max_token_bytes, trust_domains=self.trust_domains)
        exp = self._check_claims(p)
        key, pyjwk = self._key(p, bundle)
        self._check_signature(p, pyjwk)
        return self._identity(p, key.kid, exp)

    def verify_cached(self, token: str) -> WorkloadIdentity | None:
        """``token``'s identity when the verified-token cache answers it without awaiting, else ``None``
        (then :meth:`verify` decides). Issue 14, session 13: a cache hit builds no coroutine.

        The checks of :meth:`verify`'s cache hit, in its order: the exact string's memoised parse and
        name (:meth:`VerifiedTokenCache.spelling`), the time claims against now, the token's trust
        domain's current bundle (no refresh due) holding its ``kid``, and the live entry under that
        domain's current keys version (:meth:`VerifiedTokenCache.get`). ``None`` when the string is not
        memoised, a refresh is due, the bundle lacks the kid (:meth:`verify` refreshes once) or no live
        entry exists. Raises :class:`AuthenticationError` as :meth:`verify` does for a token whose time
        claims fail now, a foreign trust domain or an unavailable bundle (no signature checked).
        """
        memo = self.cache.spelling(token)
        if memo is None:
            return None
        name, (parsed, times) = memo  # type: ignore[misc]
        if not times_ok(times, now=self._clock(), leeway_s=self.leeway_s, max_lifetime_s=self.max_lifetime_s):
            self._check_claims(parsed)  # type: ignore[arg-type]  # raises the refusal's reason
        td = parsed.spiffe_id.trust_domain  # type: ignore[attr-defined]
        now = self._bundle_now(td, parsed.kid)  # type: ignore[attr-defined]
        if now is None:
            return None
        return self.cache.get(name, td, now[1])

    async def verify(self, token: str, *, before_signature: Callable[[], None] | None = None) -> WorkloadIdentity:
        """Verify a JWT-SVID and return the authenticated workload.

        Looks the signing key up by ``kid`` in the bundle of the trust domain
        named by ``sub`` only; on an unknown kid the source gets one chance to
        refresh (key rotation). A token already verified under the domain's
        current keys is answered from the cache without a signature check.
        ``before_signature`` is called right before a signature check (never
        for a cache hit nor for a token refused earlier); whatever it raises
        propagates unchanged (the gateway's per-source 429).

        Raises :class:`AuthenticationError`; its ``reason`` is
        ``bundle_unavailable`` (status 503) when the domain's bundle cannot be
        served; its ``signature_checked`` tells whether a signature check was
        spent on it.
        """
        memo = self.cache.spelling(token)
        if memo is not None:
            # this exact string verified before: its parse and name are taken from the
            # cache's memo; time claims, audience, bundle, kid and entry are checked as below
            name, (parsed, times) = memo  # type: ignore[misc]
            assert isinstance(parsed, ParsedToken)
            # its audience and lifetime passed before, with this verifier; the time tests again, against now
            # (session 8: no claims parsed again); a failure takes the full check for the refusal's reason
            if not times_ok(times, now=self._clock(), leeway_s=self.leeway_s, max_lifetime_s=self.max_lifetime_s):
                self._check_claims(parsed)
            td = parsed.spiffe_id.trust_domain
            # no refresh due and the kid known: no coroutine (session 9); else the awaited path
            bundle, version = self._bundle_now(td, parsed.kid) or await self._bundle(td, parsed.kid)
            if bundle.get(parsed.kid) is None:  # as self._key would refuse it
                raise _fail(Reason.UNKNOWN_KID, "no key with this kid in the token's trust domain")
            hit = self.cache.get(name, td, version)
            if hit is not None:
                return hit
        p = parse_token(token, max_token_bytes=self.max_token_bytes, trust_domains=self.trust_domains)
        exp = self._check_claims(p)
        td = p.spiffe_id.trust_domain
        bundle, version = await self._bundle(td, p.kid)
        key, pyjwk = self._key(p, bundle)
        # = canonical_token_sha256(token), from the parts already parsed
        name = canonical_name(token.rpartition(".")[0], p.signature, p.alg)
        hit = self.cache.get(name, td, version)
        if hit is not None:
            self.cache.remember_spelling(token, name, (p, time_claims(p)))
            return hit
        if before_signature is not None:
            before_signature()
        self._check_signature(p, pyjwk)
        identity = self._identity(p, key.kid, exp)
        self.cache.put(name, identity, version)
        self.cache.remember_spelling(token, name, (p, time_claims(p)))
        return identity

    def _bundle_now(self, td: str, kid: str) -> tuple[TrustBundle, object] | None:
        """:meth:`_bundle`'s answer when it needs no await (no refresh due, ``kid`` in the bundle), else None.

        Raises what :meth:`_bundle` raises for an unknown domain or a stale bundle."""
        try:
            return self.store.current_keys(td, kid)
        except UnknownTrustDomain:
            raise _fail(Reason.FOREIGN_TRUST_DOMAIN, "no trust bundle for the token's trust domain") from None
        except (BundleUnavailable, BundleError):
            raise _fail(Reason.BUNDLE_UNAVAILABLE, "trust bundle unavailable; try again later") from None

    async def _bundle(self, td: str, kid: str) -> tuple[TrustBundle, object]:
        """The current bundle of ``td`` (one early refresh when it lacks ``kid``) and its keys version.

        Raises :class:`AuthenticationError` ``foreign_trust_domain`` or ``bundle_unavailable``."""
        try:
            bundle = await self.store.get(td)
            if bundle.get(kid) is None:
                bundle = await self.store.refresh_for_unknown_kid(td)
            return bundle, self.store.generation(td)
        except UnknownTrustDomain:
            raise _fail(Reason.FOREIGN_TRUST_DOMAIN, "no trust bundle for the token's trust domain") from None
        except (BundleUnavailable, BundleError):
            raise _fail(Reason.BUNDLE_UNAVAILABLE, "trust bundle unavailable; try again later") from None
