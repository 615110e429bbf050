"""Parse one SPIFFE trust bundle document (JWT authorities) into a :class:`TrustBundle`.

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

The bundle errors (:class:`BundleError` and its subclasses) live here too, so
that the sources and the store share them without importing each other.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

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
