"""Issue 10, finding 7: ECDSA high-S twins of a JWT-SVID.

Decision (docs/identity.md, "ECDSA twins"): both forms verify, because RFC
7518 3.4 does not require low-S and real issuers emit either form (the demo
issuer, on OpenSSL, does so about half the time; Go's ``crypto/ecdsa`` under
SPIRE too). What a twin must not do is look like a different token:
:func:`canonical_token_sha256` gives a token and its twin one name, while a
forged signature or other claims get another. Non-canonical base64url (set
pad bits, the other way to re-spell a signature without the key) is refused.
"""

from __future__ import annotations

import base64

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import encode_dss_signature

from gateway.identity import (
    AuthenticationError,
    JwtSvidVerifier,
    Reason,
    StaticBundleSource,
    TrustBundleStore,
    canonical_token_sha256,
    parse_bundle,
)
from sim.spiffe_issuer import DemoIssuer

TD = "twins.example"
SID = f"spiffe://{TD}/ns/t/sa/app"
AUD = "prefixgate"
HASHES = {"ES256": hashes.SHA256(), "ES384": hashes.SHA384(), "ES512": hashes.SHA512()}
#: Curve orders n, written out independently of the code under test (SEC 2 v2 / FIPS 186-4 D.1.2).
ORDERS = {
    "ES256": 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551,
    "ES384": 0xFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFC7634D81F4372DDF581A0DB248B0A77AECEC196ACCC52973,
    "ES512": int(
        "01FFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFFF"
        "FA51868783BF2F966B7FCC0148F709A5D03BB5C9B8899C47AEBB6FB71E91386409", 16),
}


def b64d(seg: str) -> bytes:
    return base64.urlsafe_b64decode(seg + "=" * (-len(seg) % 4))


def b64e(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def twin(token: str, alg: str) -> tuple[str, bool]:
    """``(the token with s replaced by n - s, whether the ORIGINAL was high-S)``."""
    h, p, s = token.split(".")
    sig = b64d(s)
    size = len(sig) // 2
    n = ORDERS[alg]
    r, sv = int.from_bytes(sig[:size], "big"), int.from_bytes(sig[size:], "big")
    return f"{h}.{p}.{b64e(r.to_bytes(size, 'big') + (n - sv).to_bytes(size, 'big'))}", sv > n // 2


def verifier_for(iss: DemoIssuer) -> tuple[JwtSvidVerifier, object]:
    bundle = parse_bundle(TD, iss.bundle())
    return JwtSvidVerifier(TrustBundleStore({TD: StaticBundleSource(bundle)}), AUD, [TD]), bundle


@pytest.mark.parametrize("alg", ["ES256", "ES384", "ES512"])
def test_high_s_twin_verifies_and_shares_the_canonical_name(alg: str) -> None:
    iss = DemoIssuer(TD, alg=alg)
    v, bundle = verifier_for(iss)
    seen_high = seen_low = False
    for i in range(200):  # about half of OpenSSL's signatures are high-S: go on until both forms were seen
        if i >= 12 and seen_high and seen_low:
            break
        tok = iss.mint(SID, AUD, n=i)
        tw, was_high = twin(tok, alg)
        seen_high |= was_high
        seen_low |= not was_high
        # the twin is a valid ECDSA signature of the same signing input (checked by cryptography itself,
        # which also proves the curve orders above are right)
        h, p, s = tw.split(".")
        sig = b64d(s)
        size = len(sig) // 2
        der = encode_dss_signature(int.from_bytes(sig[:size], "big"), int.from_bytes(sig[size:], "big"))
        try:
            iss.private_key.public_key().verify(der, f"{h}.{p}".encode(), ec.ECDSA(HASHES[alg]))
        except InvalidSignature:  # pragma: no cover - would mean a wrong curve order
            pytest.fail("constructed twin is not a valid signature")
        # decision: both forms are accepted (RFC 7518 3.4 does not require low-S) ...
        assert v.verify_with_bundle(tok, bundle).claims == v.verify_with_bundle(tw, bundle).claims
        # ... and a token and its twin have ONE canonical name, different from every other token's
        assert tw != tok
        assert canonical_token_sha256(tw) == canonical_token_sha256(tok)
    assert seen_high and seen_low
    other = iss.mint(SID, AUD, n=99)
    assert canonical_token_sha256(other) != canonical_token_sha256(tok)


def test_canonical_name_separates_forged_signatures_and_other_algs() -> None:
    iss = DemoIssuer(TD)
    tok = iss.mint(SID, AUD)
    h, p, s = tok.split(".")
    forged = f"{h}.{p}.{b64e(bytes(64))}"
    assert canonical_token_sha256(forged) != canonical_token_sha256(tok)
    # RSA tokens: the name is the SHA-256 over the segments and the signature bytes as they are
    rsa = DemoIssuer(TD, alg="RS256").mint(SID, AUD)
    assert canonical_token_sha256(rsa) != canonical_token_sha256(rsa[:-2] + ("AA" if rsa[-2:] != "AA" else "BA"))
    with pytest.raises(AuthenticationError) as ei:
        canonical_token_sha256("not a token")
    assert ei.value.reason == Reason.MALFORMED


def test_signature_with_pad_bits_set_is_refused() -> None:
    """The other key-less re-spelling of a signature: base64url with non-zero pad bits.

    Only ES256 has pad bits (64 bytes -> 86 characters); ES384 (96 bytes) and
    ES512 (132 bytes) signatures are multiples of 3 bytes.
    """
    iss = DemoIssuer(TD, alg="ES256")
    v, bundle = verifier_for(iss)
    tok = iss.mint(SID, AUD)
    h, p, s = tok.split(".")
    assert len(s) % 4 == 2
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for bits in (0x01, 0x08, 0x0F):
        respelled = s[:-1] + alphabet[alphabet.index(s[-1]) | bits]
        assert respelled != s and b64d(respelled) == b64d(s)
        with pytest.raises(AuthenticationError) as ei:
            v.verify_with_bundle(f"{h}.{p}.{respelled}", bundle)
        assert ei.value.reason == Reason.MALFORMED
