from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization

from gateway.identity import (
    AuthenticationError,
    JwtSvidVerifier,
    Reason,
    TrustBundleStore,
    error_body,
    extract_bearer,
    parse_bundle,
    www_authenticate,
)
from sim.spiffe_issuer import DemoIssuer, public_jwk


AUD = "prefixgate"
TD_A = "a.example"
TD_B = "b.example"
SID_A = f"spiffe://{TD_A}/ns/prod/sa/chat"
DUP_HEADER = b'{"alg":"ES256","alg":"none"}'


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64json(obj: Any) -> str:
    return b64(json.dumps(obj, separators=(",", ":")).encode())


def hs256_token(header: dict[str, Any], claims: dict[str, Any], secret: bytes) -> str:
    """A hand-made HS256 token (PyJWT refuses to sign HS* with a PEM key)."""
    signing_input = f"{b64json(header)}.{b64json(claims)}"
    sig = hmac.new(secret, signing_input.encode(), hashlib.sha256).digest()
    return f"{signing_input}.{b64(sig)}"


@pytest.fixture
def verifier(store: TrustBundleStore) -> JwtSvidVerifier:
    return JwtSvidVerifier(store, audience=AUD, trust_domains={TD_A, TD_B}, leeway_s=30, max_lifetime_s=3600)


def refused(v: JwtSvidVerifier, token: str, issuer: DemoIssuer) -> AuthenticationError:
    with pytest.raises(AuthenticationError) as ei:
        v.verify_with_bundle(token, parse_bundle(issuer.trust_domain, issuer.bundle()))
    assert token not in str(ei.value) and token not in json.dumps(error_body(ei.value))
    return ei.value


async def test_valid_token_passes(verifier: JwtSvidVerifier, issuer_a: DemoIssuer) -> None:
    ident = await verifier.verify(issuer_a.mint(SID_A, AUD, tenant="t1"))
    assert str(ident.spiffe_id) == SID_A
    assert ident.trust_domain == TD_A
    assert ident.claims["tenant"] == "t1"
    assert ident.kid == issuer_a.kid and ident.source == "jwt-svid"


async def test_valid_rsa_domain_and_audience_list(verifier: JwtSvidVerifier, issuer_b: DemoIssuer) -> None:
    ident = await verifier.verify(issuer_b.mint(f"spiffe://{TD_B}/w", ["other", AUD]))
    assert ident.trust_domain == TD_B


@pytest.mark.parametrize("alg", ["ES384", "ES512", "RS512", "PS256", "PS512"])
def test_other_allowed_algorithms(alg: str) -> None:
    iss = DemoIssuer(TD_A, alg=alg)
    v = JwtSvidVerifier(TrustBundleStore(), AUD, {TD_A})
    ident = v.verify_with_bundle(iss.mint(SID_A, AUD), parse_bundle(TD_A, iss.bundle()))
    assert ident.spiffe_id.path == "/ns/prod/sa/chat"


def test_alg_none(verifier: JwtSvidVerifier, issuer_a: DemoIssuer) -> None:
    now = int(time.time())
    tok = f"{b64json({'alg': 'none', 'kid': issuer_a.kid})}.{b64json({'sub': SID_A, 'aud': AUD, 'exp': now + 60})}."
    assert refused(verifier, tok, issuer_a).reason in (Reason.MALFORMED, Reason.ALG_NOT_ALLOWED)
    tok2 = tok + "AAAA"
    assert refused(verifier, tok2, issuer_a).reason == Reason.ALG_NOT_ALLOWED


def test_hs256_with_public_key_pem_as_secret(issuer_b: DemoIssuer) -> None:
    # Classic key-confusion attack against the RSA domain's key.
    pem = issuer_b.private_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    now = int(time.time())
    claims = {"sub": f"spiffe://{TD_B}/evil", "aud": AUD, "exp": now + 60}
    tok = hs256_token({"alg": "HS256", "kid": issuer_b.kid, "typ": "JWT"}, claims, pem)
    v = JwtSvidVerifier(TrustBundleStore(), AUD, {TD_B})
    assert refused(v, tok, issuer_b).reason == Reason.ALG_NOT_ALLOWED


def test_header_alg_must_match_key_family(issuer_b: DemoIssuer) -> None:
    # RSA key, header says ES256 (signature made with some EC key): refused on alg, not tried.
    attacker = DemoIssuer(TD_B)
    tok = jwt.encode(
        {"sub": f"spiffe://{TD_B}/x", "aud": AUD, "exp": int(time.time()) + 60},
        attacker.private_key, algorithm="ES256", headers={"kid": issuer_b.kid},
    )
    v = JwtSvidVerifier(TrustBundleStore(), AUD, {TD_B})
    assert refused(v, tok, issuer_b).reason == Reason.ALG_NOT_ALLOWED


def test_declared_key_alg_is_binding() -> None:
    iss = DemoIssuer(TD_B, alg="RS256", publish_alg=True)
    tok = jwt.encode(
        {"sub": f"spiffe://{TD_B}/x", "aud": AUD, "exp": int(time.time()) + 60},
        iss.private_key, algorithm="PS256", headers={"kid": iss.kid},
    )
    v = JwtSvidVerifier(TrustBundleStore(), AUD, {TD_B})
    assert refused(v, tok, iss).reason == Reason.ALG_NOT_ALLOWED
    # Without a declared alg the same RSA key may verify PS256 (same family).
    iss.publish_alg = False
    assert v.verify_with_bundle(tok, parse_bundle(TD_B, iss.bundle())).trust_domain == TD_B


def test_unknown_kid(verifier: JwtSvidVerifier, issuer_a: DemoIssuer) -> None:
    tok = issuer_a.mint(SID_A, AUD, headers={"kid": "nope"})
    assert refused(verifier, tok, issuer_a).reason == Reason.UNKNOWN_KID
    no_kid = jwt.encode({"sub": SID_A, "aud": AUD, "exp": int(time.time()) + 60},
                        issuer_a.private_key, algorithm="ES256")
    assert refused(verifier, no_kid, issuer_a).reason == Reason.UNKNOWN_KID


def test_bad_signature(verifier: JwtSvidVerifier, issuer_a: DemoIssuer) -> None:
    attacker = DemoIssuer(TD_A)
    tok = jwt.encode({"sub": SID_A, "aud": AUD, "exp": int(time.time()) + 60},
                     attacker.private_key, algorithm="ES256", headers={"kid": issuer_a.kid})
    assert refused(verifier, tok, issuer_a).reason == Reason.BAD_SIGNATURE
    # Tampered payload of a genuine token.
    good = issuer_a.mint(SID_A, AUD)
    h, _, s = good.split(".")
    forged = f"{h}.{b64json({'sub': SID_A, 'aud': AUD, 'exp': int(time.time()) + 60, 'admin': True})}.{s}"
    assert refused(verifier, forged, issuer_a).reason == Reason.BAD_SIGNATURE


@pytest.mark.parametrize(
    "claims, reason",
    [
        ({"exp": -100, "iat": -400}, Reason.EXPIRED),
        ({"nbf": 600}, Reason.NOT_YET_VALID),
        ({"iat": 600, "exp": 900}, Reason.NOT_YET_VALID),
        ({"exp": 7200, "iat": None}, Reason.LIFETIME_TOO_LONG),
        ({"exp": 3000, "iat": -1000}, Reason.LIFETIME_TOO_LONG),
        ({"exp": None}, Reason.MISSING_CLAIM),
        ({"exp": "soon"}, Reason.MALFORMED),
    ],
)
def test_time_claims(verifier: JwtSvidVerifier, issuer_a: DemoIssuer, claims: dict[str, Any], reason: Reason) -> None:
    now = int(time.time())
    rel = {k: (now + v if isinstance(v, int) else v) for k, v in claims.items()}
    tok = issuer_a.mint(SID_A, AUD, **rel)
    assert refused(verifier, tok, issuer_a).reason == reason


def test_leeway_and_clock(issuer_a: DemoIssuer, store: TrustBundleStore) -> None:
    t0 = 1_700_000_000.0
    tok = issuer_a.mint(SID_A, AUD, ttl_s=300, now=t0)
    bundle = parse_bundle(TD_A, issuer_a.bundle())
    for now, ok in [(t0, True), (t0 + 320, True), (t0 + 331, False), (t0 - 25, True), (t0 - 40, False)]:
        v = JwtSvidVerifier(store, AUD, {TD_A}, leeway_s=30, clock=lambda n=now: n)
        if ok:
            assert v.verify_with_bundle(tok, bundle).expires_at == t0 + 300
        else:
            with pytest.raises(AuthenticationError):
                v.verify_with_bundle(tok, bundle)


def test_lifetime_enforced_without_iat(issuer_a: DemoIssuer, store: TrustBundleStore) -> None:
    v = JwtSvidVerifier(store, AUD, {TD_A}, max_lifetime_s=600, leeway_s=0)
    bundle = parse_bundle(TD_A, issuer_a.bundle())
    assert v.verify_with_bundle(issuer_a.mint(SID_A, AUD, ttl_s=590, iat=None), bundle)
    with pytest.raises(AuthenticationError) as ei:
        v.verify_with_bundle(issuer_a.mint(SID_A, AUD, ttl_s=700, iat=None), bundle)
    assert ei.value.reason == Reason.LIFETIME_TOO_LONG


@pytest.mark.parametrize(
    "aud, reason",
    [("someone-else", Reason.AUDIENCE), (["a", "b"], Reason.AUDIENCE), ([], Reason.AUDIENCE),
     (None, Reason.MISSING_CLAIM), (42, Reason.AUDIENCE), ("prefixgate-evil", Reason.AUDIENCE)],
)
def test_audience(verifier: JwtSvidVerifier, issuer_a: DemoIssuer, aud: Any, reason: Reason) -> None:
    tok = issuer_a.mint(SID_A, "x", aud=aud)
    assert refused(verifier, tok, issuer_a).reason == reason


def test_sub_in_other_trust_domain(issuer_a: DemoIssuer, store: TrustBundleStore) -> None:
    v = JwtSvidVerifier(store, AUD, {TD_A})
    tok = issuer_a.mint("spiffe://c.example/w", AUD)
    assert refused(v, tok, issuer_a).reason == Reason.FOREIGN_TRUST_DOMAIN


async def test_key_of_domain_a_cannot_vouch_for_domain_b(
    verifier: JwtSvidVerifier, issuer_a: DemoIssuer, issuer_b: DemoIssuer
) -> None:
    # Signed by A's genuine key, with A's kid, claiming an identity in B.
    tok = issuer_a.mint(f"spiffe://{TD_B}/payments", AUD)
    with pytest.raises(AuthenticationError) as ei:
        await verifier.verify(tok)
    assert ei.value.reason == Reason.UNKNOWN_KID
    # Even handing the verifier A's bundle directly does not help.
    assert refused(verifier, tok, issuer_a).reason == Reason.UNKNOWN_KID
    # And a B bundle that happened to reuse A's kid still needs B's signature.
    shared = DemoIssuer(TD_B, alg="ES256")
    jwk_b = shared.public_jwk()
    jwk_b["kid"] = issuer_a.kid
    bundle_b = parse_bundle(TD_B, {"keys": [jwk_b]})
    with pytest.raises(AuthenticationError) as ei:
        verifier.verify_with_bundle(tok, bundle_b)
    assert ei.value.reason == Reason.BAD_SIGNATURE


@pytest.mark.parametrize(
    "sub", ["https://a.example/x", "spiffe://A.example/x", "spiffe://a.example/x/", "spiffe://a.example/../x", 7]
)
def test_malformed_spiffe_id(verifier: JwtSvidVerifier, issuer_a: DemoIssuer, sub: Any) -> None:
    tok = issuer_a.mint("spiffe://a.example/x", AUD, sub=sub)
    assert refused(verifier, tok, issuer_a).reason == Reason.BAD_SPIFFE_ID


def test_missing_sub(verifier: JwtSvidVerifier, issuer_a: DemoIssuer) -> None:
    tok = issuer_a.mint(SID_A, AUD, sub=None)
    assert refused(verifier, tok, issuer_a).reason == Reason.MISSING_CLAIM


def test_jku_and_x5u_are_ignored(verifier: JwtSvidVerifier, issuer_a: DemoIssuer) -> None:
    hdr = {"jku": "https://attacker.example/jwks.json", "x5u": "https://attacker.example/c.pem"}
    # Genuine key: still verifies (headers ignored, nothing fetched).
    ok = issuer_a.mint(SID_A, AUD, headers=hdr)
    assert verifier.verify_with_bundle(ok, parse_bundle(TD_A, issuer_a.bundle())).trust_domain == TD_A
    # Attacker key advertised through jku, with the genuine kid: refused.
    attacker = DemoIssuer(TD_A)
    bad = jwt.encode({"sub": SID_A, "aud": AUD, "exp": int(time.time()) + 60}, attacker.private_key,
                     algorithm="ES256", headers={**hdr, "kid": issuer_a.kid})
    assert refused(verifier, bad, issuer_a).reason == Reason.BAD_SIGNATURE
    # ...or with the attacker's own kid: unknown.
    bad2 = attacker.mint(SID_A, AUD, headers=hdr)
    assert refused(verifier, bad2, issuer_a).reason == Reason.UNKNOWN_KID


def test_embedded_jwk_is_ignored(verifier: JwtSvidVerifier, issuer_a: DemoIssuer) -> None:
    attacker = DemoIssuer(TD_A)
    jwk = public_jwk(attacker.private_key, "ES256")
    bad = jwt.encode({"sub": SID_A, "aud": AUD, "exp": int(time.time()) + 60}, attacker.private_key,
                     algorithm="ES256", headers={"jwk": jwk, "kid": issuer_a.kid})
    assert refused(verifier, bad, issuer_a).reason == Reason.BAD_SIGNATURE


def test_crit_header(verifier: JwtSvidVerifier, issuer_a: DemoIssuer) -> None:
    tok = issuer_a.mint(SID_A, AUD, headers={"crit": ["exp"], "exp": 1})
    assert refused(verifier, tok, issuer_a).reason == Reason.CRIT_HEADER


@pytest.mark.parametrize("typ", ["at+jwt", "JWS", "JWE", 1])
def test_bad_typ(verifier: JwtSvidVerifier, issuer_a: DemoIssuer, typ: Any) -> None:
    tok = issuer_a.mint(SID_A, AUD, headers={"typ": typ})
    assert refused(verifier, tok, issuer_a).reason == Reason.BAD_TYP


def test_typ_jose_and_absent_ok(verifier: JwtSvidVerifier, issuer_a: DemoIssuer) -> None:
    bundle = parse_bundle(TD_A, issuer_a.bundle())
    assert verifier.verify_with_bundle(issuer_a.mint(SID_A, AUD, headers={"typ": "JOSE"}), bundle)
    assert verifier.verify_with_bundle(issuer_a.mint(SID_A, AUD, headers={"typ": None}), bundle)


@pytest.mark.parametrize(
    "tok, reason",
    [
        ("", Reason.MISSING_TOKEN),
        ("garbage", Reason.MALFORMED),
        ("a.b", Reason.MALFORMED),
        ("a.b.c.d.e", Reason.MALFORMED),
        ("!!!.???.***", Reason.MALFORMED),
        (f"{b64(b'not json')}.{b64json({})}.AAAA", Reason.MALFORMED),
        (f"{b64json([1])}.{b64json({})}.AAAA", Reason.MALFORMED),
        (f"{b64(DUP_HEADER)}.{b64json({})}.AAAA", Reason.MALFORMED),
        ("x" * 9000, Reason.TOKEN_TOO_LARGE),
    ],
)
def test_garbage(verifier: JwtSvidVerifier, issuer_a: DemoIssuer, tok: str, reason: Reason) -> None:
    with pytest.raises(AuthenticationError) as ei:
        verifier.verify_with_bundle(tok, parse_bundle(TD_A, issuer_a.bundle()))
    assert ei.value.reason == reason


def test_duplicate_payload_member_refused(verifier: JwtSvidVerifier, issuer_a: DemoIssuer) -> None:
    good = issuer_a.mint(SID_A, AUD)
    h, _, s = good.split(".")
    dup = b64(f'{{"sub":"{SID_A}","sub":"spiffe://a.example/admin","aud":"{AUD}","exp":1}}'.encode())
    assert refused(verifier, f"{h}.{dup}.{s}", issuer_a).reason == Reason.MALFORMED


async def test_missing_bundle_fails_closed(issuer_a: DemoIssuer) -> None:
    v = JwtSvidVerifier(TrustBundleStore(), AUD, {TD_A})
    with pytest.raises(AuthenticationError) as ei:
        await v.verify(issuer_a.mint(SID_A, AUD))
    assert ei.value.reason == Reason.FOREIGN_TRUST_DOMAIN and ei.value.status == 401


def test_error_rendering() -> None:
    err = AuthenticationError(Reason.EXPIRED, 'token has "expired"\n')
    assert www_authenticate(err) == (
        'Bearer realm="prefixgate", error="invalid_token", error_description="token has expired"'
    )
    assert error_body(err) == {
        "error": {"message": 'token has "expired"\n', "type": "authentication_error", "code": "expired"}
    }
    missing = AuthenticationError(Reason.MISSING_TOKEN, "no bearer token")
    assert www_authenticate(missing) == 'Bearer realm="prefixgate"'
    assert AuthenticationError(Reason.BUNDLE_UNAVAILABLE, "x").status == 503


def test_extract_bearer() -> None:
    assert extract_bearer("Bearer abc.def.ghi") == "abc.def.ghi"
    assert extract_bearer("bearer abc") == "abc"
    for bad, reason in [(None, Reason.MISSING_TOKEN), ("", Reason.MISSING_TOKEN),
                        ("Basic dXNlcg==", Reason.MALFORMED_HEADER), ("Bearer", Reason.MISSING_TOKEN),
                        ("bearer ", Reason.MISSING_TOKEN),
                        ("Bearer a b", Reason.MALFORMED_HEADER)]:
        with pytest.raises(AuthenticationError) as ei:
            extract_bearer(bad)
        assert ei.value.reason == reason
