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
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import json
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import jwt

from .bundle import (
    ALLOWED_ALGORITHMS,
    BundleError,
    BundleKey,
    BundleUnavailable,
    KeyAlgorithmMismatch,
    TrustBundle,
    TrustBundleStore,
    UnknownTrustDomain,
)
from .spiffe_id import InvalidSpiffeId, SpiffeId, WorkloadIdentity, parse_spiffe_id, parse_trust_domain
from .token_cache import DEFAULT_MAX_TTL_S as DEFAULT_CACHE_MAX_TTL_S
from .token_cache import DEFAULT_MAXSIZE as DEFAULT_CACHE_SIZE
from .token_cache import VerifiedTokenCache

#: Largest accepted compact JWS, in bytes.
MAX_TOKEN_BYTES = 8 * 1024
#: Compact JWS shape. The signature segment may be empty so that an unsecured
#: JWS (``alg: none``, RFC 7515 A.5) is parsed and refused as ``alg_not_allowed``
#: (the precise reason, useful in the audit trail); with any allowed alg an
#: empty signature never verifies.
_COMPACT_RE = re.compile(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]*")
_ALLOWED_TYP = frozenset({"JWT", "JOSE"})
REALM = "prefixgate"


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


class Reason(enum.StrEnum):
    """Which check refused a credential (stable strings, safe to log and return)."""

    MISSING_TOKEN = "missing_token"
    MALFORMED_HEADER = "malformed_authorization_header"
    TOKEN_TOO_LARGE = "token_too_large"
    MALFORMED = "malformed"
    ALG_NOT_ALLOWED = "alg_not_allowed"
    UNKNOWN_KID = "unknown_kid"
    BAD_SIGNATURE = "bad_signature"
    EXPIRED = "expired"
    NOT_YET_VALID = "not_yet_valid"
    AUDIENCE = "audience"
    MISSING_CLAIM = "missing_claim"
    BAD_SPIFFE_ID = "bad_spiffe_id"
    FOREIGN_TRUST_DOMAIN = "foreign_trust_domain"
    LIFETIME_TOO_LONG = "lifetime_too_long"
    CRIT_HEADER = "crit_header"
    BAD_TYP = "bad_typ"
    BUNDLE_UNAVAILABLE = "bundle_unavailable"
    IDENTITY_MISMATCH = "identity_mismatch"
    INVALID_FORWARDED_CERT = "invalid_forwarded_certificate"


#: RFC 6750 error code per reason ("" = no error attribute, RFC 6750 3.1:
#: a request without credentials gets a bare challenge).
_CODE: dict[Reason, str] = {
    Reason.MISSING_TOKEN: "",
    Reason.MALFORMED_HEADER: "invalid_request",
}
#: HTTP status per reason; default 401.
_STATUS: dict[Reason, int] = {
    Reason.MALFORMED_HEADER: 400,
    Reason.BUNDLE_UNAVAILABLE: 503,
}


class AuthenticationError(Exception):
    """A credential was refused.

    ``code``: RFC 6750 error code (``invalid_token``, ``invalid_request`` or
    ``""`` for a missing token); ``reason``: a :class:`Reason`;
    ``description``: human text that never contains the token or claims
    values beyond the check that failed; ``status``: HTTP status to answer
    (401; 400 for a malformed Authorization header; 503 when the trust
    bundle is unavailable, which is still a refusal: fail closed).
    """

    def __init__(self, reason: Reason, description: str, *, signature_checked: bool = False) -> None:
        super().__init__(f"{reason.value}: {description}")
        self.reason = reason
        self.code = _CODE.get(reason, "invalid_token")
        self.description = description
        self.status = _STATUS.get(reason, 401)
        #: True when the refusal came from a signature verification (the costly
        #: step): only such refusals count against the caller's source.
        self.signature_checked = signature_checked


def _fail(reason: Reason, description: str, *, signature_checked: bool = False) -> AuthenticationError:
    return AuthenticationError(reason, description, signature_checked=signature_checked)


def _quote(s: str) -> str:
    # RFC 6750 3: error_description is %x20-21 / %x23-5B / %x5D-7E.
    return "".join(c for c in s if 0x20 <= ord(c) <= 0x7E and c not in '"\\')


def www_authenticate(err: AuthenticationError | None = None) -> str:
    """The ``WWW-Authenticate`` header value for a refusal (RFC 6750 3).

    ``Bearer realm="prefixgate", error="invalid_token", error_description="..."``;
    just ``Bearer realm="prefixgate"`` when ``err`` is ``None`` or the token
    was missing.
    """
    value = f'Bearer realm="{REALM}"'
    if err is not None and err.code:
        value += f', error="{err.code}", error_description="{_quote(err.description)}"'
    return value


def error_body(err: AuthenticationError) -> dict[str, Any]:
    """OpenAI-style JSON error body: ``{"error": {"message", "type", "code"}}``.

    ``type`` is ``"authentication_error"`` (``"service_unavailable"`` for
    503); ``code`` is the :class:`Reason` value. Never echoes the token.
    """
    kind = "service_unavailable" if err.status == 503 else "authentication_error"
    return {"error": {"message": err.description, "type": kind, "code": err.reason.value}}


def extract_bearer(authorization: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header value.

    Raises :class:`AuthenticationError` with ``missing_token`` (401, bare
    challenge, RFC 6750 3.1) when absent, empty, or the ``Bearer`` scheme with
    an empty credential (``"Bearer"``, ``"Bearer "``: HTTP servers strip the
    trailing space, so both are the same request without credentials);
    ``malformed_authorization_header`` (400) for another scheme or shape.
    The scheme is case-insensitive (RFC 6750 2.1, RFC 9110 11.1).
    """
    if authorization is None or not authorization.strip() or authorization.strip().lower() == "bearer":
        raise _fail(Reason.MISSING_TOKEN, "no bearer token")
    parts = authorization.strip().split(" ")
    if len(parts) != 2 or parts[0].lower() != "bearer" or not parts[1]:
        raise _fail(Reason.MALFORMED_HEADER, "expected 'Authorization: Bearer <JWT-SVID>'")
    return parts[1]


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
    return _canonical_name(f"{h_seg}.{p_seg}", sig, alg)


def _canonical_name(signing_input: str, sig: bytes, alg: Any) -> str:
    """:func:`canonical_token_sha256` from its parts: ``header "." payload`` (the
    base64url segments), the decoded signature and the header's ``alg``."""
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


@dataclass(frozen=True, slots=True)
class _Parsed:
    token: str
    header: dict[str, Any]
    claims: dict[str, Any]
    spiffe_id: SpiffeId
    kid: str
    alg: str
    signature_len: int
    signature: bytes = b""


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

    # -- step 1: structure, header and the claimed trust domain (unverified) --
    def _parse(self, token: str) -> _Parsed:
        if not isinstance(token, str) or not token:
            raise _fail(Reason.MISSING_TOKEN, "no bearer token")
        if len(token) > self.max_token_bytes:
            raise _fail(Reason.TOKEN_TOO_LARGE, f"token larger than {self.max_token_bytes} bytes")
        if not _COMPACT_RE.fullmatch(token):
            raise _fail(Reason.MALFORMED, "token is not a compact JWS (base64url header.payload.signature)")
        h_seg, p_seg, s_seg = token.split(".")
        header = _b64json(h_seg, "header")
        if "crit" in header:
            raise _fail(Reason.CRIT_HEADER, "critical header extensions are not supported")
        if "b64" in header:
            raise _fail(Reason.MALFORMED, "unencoded payloads (b64) are not accepted")
        typ = header.get("typ")
        if typ is not None and typ not in _ALLOWED_TYP:
            raise _fail(Reason.BAD_TYP, "typ must be JWT or JOSE")
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in ALLOWED_ALGORITHMS:
            raise _fail(Reason.ALG_NOT_ALLOWED, "alg is not an allowed asymmetric JWS algorithm")
        signature = _strict_b64(s_seg)
        claims = _b64json(p_seg, "payload")
        sub = claims.get("sub")
        if sub is None:
            raise _fail(Reason.MISSING_CLAIM, "missing claim 'sub'")
        if not isinstance(sub, str):
            raise _fail(Reason.BAD_SPIFFE_ID, "sub is not a SPIFFE ID")
        try:
            sid = parse_spiffe_id(sub)
        except InvalidSpiffeId as e:
            raise _fail(Reason.BAD_SPIFFE_ID, f"sub is not a valid SPIFFE ID ({e.reason})") from None
        if sid.trust_domain not in self.trust_domains:
            raise _fail(Reason.FOREIGN_TRUST_DOMAIN, "sub is in a trust domain this gateway does not accept")
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid:
            raise _fail(Reason.UNKNOWN_KID, "token header names no kid")
        return _Parsed(token=token, header=header, claims=claims, spiffe_id=sid, kid=kid, alg=alg,
                       signature_len=len(signature), signature=signature)

    # -- step 2: time claims and audience, still unverified: may only refuse --
    def _check_claims(self, p: _Parsed) -> float:
        """Refuse on the payload's time claims and audience; returns ``exp``.

        Runs before the signature is checked, so it never accepts anything:
        a token passing here is still verified (or found in the cache of
        verified tokens) before it is believed.
        """
        c = p.claims
        now = self._clock()
        lw = self.leeway_s
        exp = _number(c, "exp")
        if exp is None:
            raise _fail(Reason.MISSING_CLAIM, "missing claim 'exp'")
        nbf = _number(c, "nbf")
        iat = _number(c, "iat")
        if exp <= now - lw:
            raise _fail(Reason.EXPIRED, "token has expired")
        if nbf is not None and nbf > now + lw:
            raise _fail(Reason.NOT_YET_VALID, "token is not yet valid (nbf)")
        if iat is not None and iat > now + lw:
            raise _fail(Reason.NOT_YET_VALID, "token is issued in the future (iat)")
        if exp - now > self.max_lifetime_s + lw or (iat is not None and exp - iat > self.max_lifetime_s):
            raise _fail(Reason.LIFETIME_TOO_LONG, f"token lifetime exceeds {self.max_lifetime_s:.0f} s")
        aud = c.get("aud")
        if aud is None:
            raise _fail(Reason.MISSING_CLAIM, "missing claim 'aud'")
        auds = [aud] if isinstance(aud, str) else aud
        if not isinstance(auds, list) or not auds or not all(isinstance(a, str) for a in auds):
            raise _fail(Reason.AUDIENCE, "aud is not a string or a list of strings")
        if self.audience not in auds:
            raise _fail(Reason.AUDIENCE, "token audience does not include this gateway")
        return exp

    # -- step 3: the key of THAT trust domain (no signature work) --
    def _key(self, p: _Parsed, bundle: TrustBundle) -> tuple[BundleKey, jwt.PyJWK]:
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
    def _check_signature(self, p: _Parsed, pyjwk: jwt.PyJWK) -> None:
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

    def _identity(self, p: _Parsed, kid: str, exp: float) -> WorkloadIdentity:
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
        p = self._parse(token)
        exp = self._check_claims(p)
        key, pyjwk = self._key(p, bundle)
        self._check_signature(p, pyjwk)
        return self._identity(p, key.kid, exp)

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
        p = self._parse(token)
        exp = self._check_claims(p)
        td = p.spiffe_id.trust_domain
        try:
            bundle = await self.store.get(td)
            if bundle.get(p.kid) is None:
                bundle = await self.store.refresh_for_unknown_kid(td)
            version = self.store.generation(td)
        except UnknownTrustDomain:
            raise _fail(Reason.FOREIGN_TRUST_DOMAIN, "no trust bundle for the token's trust domain") from None
        except (BundleUnavailable, BundleError):
            raise _fail(Reason.BUNDLE_UNAVAILABLE, "trust bundle unavailable; try again later") from None
        key, pyjwk = self._key(p, bundle)
        # = canonical_token_sha256(token), from the parts already parsed
        name = _canonical_name(token.rpartition(".")[0], p.signature, p.alg)
        hit = self.cache.get(name, td, version)
        if hit is not None:
            return hit
        if before_signature is not None:
            before_signature()
        self._check_signature(p, pyjwk)
        identity = self._identity(p, key.kid, exp)
        self.cache.put(name, identity, version)
        return identity


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
