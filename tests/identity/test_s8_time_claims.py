"""Session 8 (issue 14): the verified-token cache's spelling memo keeps a token's time claims, and the
verifier's test of them against now (``times_ok``) agrees with ``check_claims`` for every token that
passed ``check_claims`` once (audience and ``exp - iat`` do not change with time)."""
from __future__ import annotations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gateway.identity.jwtsvid_claims import ParsedToken, check_claims, time_claims, times_ok
from gateway.identity.spiffe_id import parse_spiffe_id
from gateway.identity import AuthenticationError

AUD = "gw"
_t = st.one_of(st.integers(-5000, 5000), st.floats(-5000, 5000, allow_nan=False))


def _token(exp: float, nbf: float | None, iat: float | None) -> ParsedToken:
    claims: dict = {"sub": "spiffe://d.example/a", "aud": [AUD], "exp": exp}
    if nbf is not None:
        claims["nbf"] = nbf
    if iat is not None:
        claims["iat"] = iat
    return ParsedToken(token="x", header={}, claims=claims, spiffe_id=parse_spiffe_id("spiffe://d.example/a"),
                       kid="k", alg="ES256", signature_len=64)


def _passes(p: ParsedToken, now: float, lw: float, life: float) -> bool:
    try:
        check_claims(p, now=now, leeway_s=lw, max_lifetime_s=life, audience=AUD)
        return True
    except AuthenticationError:
        return False


_d = st.one_of(st.integers(-100, 4000), st.floats(-100, 4000, allow_nan=False))


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(first=_t, a=_d, b=st.one_of(st.none(), _d), c=st.one_of(st.none(), _d), now=st.one_of(_t, _d),
       lw=st.sampled_from([0.0, 5.0, 30.0]), life=st.sampled_from([60.0, 3600.0]))
def test_times_ok_agrees_with_check_claims(first, a, b, c, now, lw, life) -> None:
    exp = first + a  # the claims around the moment it verified first
    p = _token(exp, None if b is None else first - b, None if c is None else first - c)
    assume(_passes(p, first, lw, life))  # it verified once (that is when the memo keeps it)
    for t in (now, first + now / 100, exp + lw, exp - lw, first):
        assert times_ok(time_claims(p), now=t, leeway_s=lw, max_lifetime_s=life) == _passes(p, t, lw, life)
