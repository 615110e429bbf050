"""The JWT-SVID checks that need no key: token shape and header, then time claims and audience.

Steps 1 and 2 of :meth:`gateway.identity.jwtsvid.JwtSvidVerifier.verify`
(JWT-SVID spec sections 2-4, RFC 8725 3.1-3.2, RFC 7515 4.1.11, RFC 7519
4.1.4-4.1.6). They run on the still unverified token and only ever refuse;
what passes is verified (or found among verified tokens) before it is believed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .bearer import Reason, _fail
from .bundle_parse import ALLOWED_ALGORITHMS
from .jws_compact import _COMPACT_RE, _b64json, _number, _strict_b64
from .spiffe_id import InvalidSpiffeId, SpiffeId, parse_spiffe_id

_ALLOWED_TYP = frozenset({"JWT", "JOSE"})


@dataclass(frozen=True, slots=True)
class ParsedToken:
    """A token that passed step 1 (shape and header), not yet verified."""

    token: str
    header: dict[str, Any]
    claims: dict[str, Any]
    spiffe_id: SpiffeId
    kid: str
    alg: str
    signature_len: int
    #: The decoded signature bytes (for :func:`jws_compact.canonical_name`).
    signature: bytes = b""


def parse_token(token: str, *, max_token_bytes: int, trust_domains: frozenset[str]) -> ParsedToken:
    """Step 1 of :meth:`JwtSvidVerifier.verify`: size, compact shape, canonical
    signature segment, JSON header/payload, header (``crit``, ``b64``, ``typ``,
    ``alg``), ``sub`` a SPIFFE ID of one of ``trust_domains``, ``kid`` present.

    Nothing is verified yet: this may only refuse. Raises
    :class:`~gateway.identity.bearer.AuthenticationError`."""
    if not isinstance(token, str) or not token:
        raise _fail(Reason.MISSING_TOKEN, "no bearer token")
    if len(token) > max_token_bytes:
        raise _fail(Reason.TOKEN_TOO_LARGE, f"token larger than {max_token_bytes} bytes")
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
    if sid.trust_domain not in trust_domains:
        raise _fail(Reason.FOREIGN_TRUST_DOMAIN, "sub is in a trust domain this gateway does not accept")
    kid = header.get("kid")
    if not isinstance(kid, str) or not kid:
        raise _fail(Reason.UNKNOWN_KID, "token header names no kid")
    return ParsedToken(token=token, header=header, claims=claims, spiffe_id=sid, kid=kid, alg=alg,
                   signature_len=len(signature), signature=signature)

# -- step 2: time claims and audience, still unverified: may only refuse --
def check_claims(p: ParsedToken, *, now: float, leeway_s: float, max_lifetime_s: float, audience: str) -> float:
    """Refuse on the payload's time claims and audience; returns ``exp``.

    Runs before the signature is checked, so it never accepts anything:
    a token passing here is still verified (or found in the cache of
    verified tokens) before it is believed.
    """
    c = p.claims
    lw = leeway_s
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
    if exp - now > max_lifetime_s + lw or (iat is not None and exp - iat > max_lifetime_s):
        raise _fail(Reason.LIFETIME_TOO_LONG, f"token lifetime exceeds {max_lifetime_s:.0f} s")
    aud = c.get("aud")
    if aud is None:
        raise _fail(Reason.MISSING_CLAIM, "missing claim 'aud'")
    auds = [aud] if isinstance(aud, str) else aud
    if not isinstance(auds, list) or not auds or not all(isinstance(a, str) for a in auds):
        raise _fail(Reason.AUDIENCE, "aud is not a string or a list of strings")
    if audience not in auds:
        raise _fail(Reason.AUDIENCE, "token audience does not include this gateway")
    return exp


def time_claims(p: ParsedToken) -> tuple[float, float | None, float | None]:
    """``(exp, nbf, iat)`` of a token that passed :func:`check_claims` (so ``exp`` is a number and the
    others numbers or absent), kept with its spelling in the verified-token cache (session 8)."""
    c = p.claims
    exp = _number(c, "exp")
    assert exp is not None
    return exp, _number(c, "nbf"), _number(c, "iat")


def times_ok(times: tuple[float, float | None, float | None], *, now: float, leeway_s: float,
             max_lifetime_s: float) -> bool:
    """Whether :func:`check_claims`'s tests that depend on ``now`` pass, for the :func:`time_claims` of a
    token that passed all of them before under the same verifier (its audience and ``exp - iat`` do not
    change with time). The same comparisons, in the same order; False: call :func:`check_claims` for
    the refusal's reason."""
    exp, nbf, iat = times
    lw = leeway_s
    return not (exp <= now - lw or (nbf is not None and nbf > now + lw) or (iat is not None and iat > now + lw)
                or exp - now > max_lifetime_s + lw)
