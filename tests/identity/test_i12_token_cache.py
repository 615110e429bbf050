"""Issue 12, finding 1 (verifier side): cheap refusals first, then the verified-token cache.

* malformed tokens, an unknown ``kid``, tokens expired (or otherwise refused)
  by their claims are refused without any signature work
  (``jwt.PyJWS.decode_complete`` is never called) and carry
  ``signature_checked=False``;
* a token already verified is answered from the verifier's cache without a
  signature check; the ``before_signature`` hook (the gateway's per-source
  budget) is called only right before a signature check;
* an entry lives until ``exp + leeway`` or the cap, whichever is first;
* a change of the trust domain's keys clears its entries (listener) and a
  cached token then meets the new keys (a removed key: ``unknown_kid``; a key
  replaced under the same kid: ``bad_signature``);
* one cache per verifier (listener and audience);
* unverified claims never accept: a forged signature over a cached token's
  payload, and a re-spelling of a cached token's signature, are refused;
  its ECDSA high-S twin shares the entry (canonical name).
"""

from __future__ import annotations

import base64
import functools
from typing import Any

import jwt
import pytest

from gateway.identity import (
    JwtSvidVerifier,
    Reason,
    StaticBundleSource,
    TrustBundleStore,
    canonical_token_sha256,
    parse_bundle,
)
from sim.spiffe_issuer import DemoIssuer
from tests.support.verifier import AUD, T0, Clock, impostor_bundle, make_verifier, refused, verify

TD = "cache.example"
SID = f"spiffe://{TD}/ns/t/sa/app"
N256 = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551


def b64d(seg: str) -> bytes:
    return base64.urlsafe_b64decode(seg + "=" * (-len(seg) % 4))


def b64e(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


@pytest.fixture
def decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every call of PyJWT's signature verification, recorded."""
    calls: list[str] = []
    real = jwt.PyJWS.decode_complete

    def spy(self: Any, jws: Any, *a: Any, **kw: Any) -> Any:
        calls.append(jws)
        return real(self, jws, *a, **kw)

    monkeypatch.setattr(jwt.PyJWS, "decode_complete", spy)
    return calls


setup = functools.partial(make_verifier, TD)


def cheap_bad_tokens(iss: DemoIssuer, other: DemoIssuer) -> dict[str, str]:
    """One token per kind that must be refused without signature work."""
    good = iss.mint(SID, AUD, now=T0)
    h, p, s = good.split(".")
    return {
        "malformed": "eyJhbGciOiJFUzI1NiJ9.not-json.AAAA",
        "garbage": "x" * 40,
        "unknown_kid": other.mint(SID, AUD, now=T0, headers={"kid": "no-such-kid"}),
        "expired": iss.mint(SID, AUD, now=T0 - 600, ttl_s=300),
        "not_yet_valid": iss.mint(SID, AUD, now=T0 + 600),
        "audience": iss.mint(SID, "someone-else", now=T0),
        "lifetime": iss.mint(SID, AUD, now=T0, ttl_s=86400),
        "alg_none": b64e(b'{"alg":"none","kid":"x"}') + f".{p}.",
        "short_signature": f"{h}.{p}.{s[:20]}",
        # expired AND a bad signature: the claims refuse it first
        "expired_forged": ".".join(iss.mint(SID, AUD, now=T0 - 600, ttl_s=300).split(".")[:2]) + "." + b64e(bytes(64)),
    }


def test_cheap_refusals_do_no_signature_work(decodes: list[str]) -> None:
    clock = Clock()
    iss, _, v = setup(clock)
    other = DemoIssuer(TD)
    hook_calls: list[int] = []
    for kind, token in cheap_bad_tokens(iss, other).items():
        for _ in range(3):
            err = refused(v, token, before_signature=lambda: hook_calls.append(1))
            assert err.signature_checked is False, kind
    assert decodes == [], "a cheap refusal reached PyJWT's signature verification"
    assert hook_calls == [] and v.signature_checks == 0


def test_verified_token_is_cached_and_hook_runs_only_before_a_signature_check(decodes: list[str]) -> None:
    clock = Clock()
    iss, _, v = setup(clock)
    token = iss.mint(SID, AUD, now=T0)
    hook_calls: list[int] = []
    first = verify(v, token, before_signature=lambda: hook_calls.append(1))
    for _ in range(5):
        again = verify(v, token, before_signature=lambda: hook_calls.append(1))
        assert again.spiffe_id == first.spiffe_id
    assert len(decodes) == 1 and v.signature_checks == 1 and hook_calls == [1]
    # a bad signature is a signature check, reported as such (what the gateway counts)
    h, p, _ = iss.mint(SID, AUD, now=T0, jti="other").split(".")
    err = refused(v, f"{h}.{p}.{b64e(bytes(64))}")
    assert err.reason == Reason.BAD_SIGNATURE and err.signature_checked is True
    # the hook can refuse a signature check; a cached token never meets it
    def block() -> None:
        raise RuntimeError("blocked")
    with pytest.raises(RuntimeError):
        verify(v, iss.mint(SID, AUD, now=T0, jti="fresh"), before_signature=block)
    assert verify(v, token, before_signature=block).spiffe_id == first.spiffe_id


def test_entry_expires_at_exp_or_at_the_cap(decodes: list[str]) -> None:
    clock = Clock()
    iss, _, v = setup(clock, cache_max_ttl_s=60)
    short = iss.mint(SID, AUD, now=T0, ttl_s=30)
    verify(v, short)
    assert v.cache.get(canonical_token_sha256(short), TD, v.store.generation(TD)) is not None
    clock.t = T0 + 29.5
    verify(v, short)
    assert len(decodes) == 1
    clock.t = T0 + 30  # exp (+ leeway 0): the entry is gone and the token is expired
    assert v.cache.get(canonical_token_sha256(short), TD, v.store.generation(TD)) is None
    assert refused(v, short).reason == Reason.EXPIRED
    # a long-lived token: the cap (60 s) ends the entry, then the signature is checked again
    clock.t = T0
    long = iss.mint(SID, AUD, now=T0, ttl_s=600)
    verify(v, long)
    clock.t = T0 + 59
    verify(v, long)
    assert len(decodes) == 2
    clock.t = T0 + 60
    verify(v, long)
    assert len(decodes) == 3


def test_leeway_extends_the_entry_like_the_verifier() -> None:
    clock = Clock()
    iss, _, v = setup(clock, leeway_s=10)
    token = iss.mint(SID, AUD, now=T0, ttl_s=30)
    verify(v, token)
    clock.t = T0 + 39
    verify(v, token)
    assert v.signature_checks == 1
    clock.t = T0 + 40
    assert refused(v, token).reason == Reason.EXPIRED
    assert len(v.cache) == 0


def test_bundle_change_clears_the_cache() -> None:
    clock = Clock()
    iss, src, v = setup(clock)
    token = iss.mint(SID, AUD, now=T0)
    verify(v, token)
    verify(v, token)
    assert v.signature_checks == 1 and len(v.cache) == 1
    # the key is removed from the bundle: the entry is dropped and the token refused
    iss.rotate()
    iss.drop_old()
    src.replace(parse_bundle(TD, iss.bundle()))
    assert len(v.cache) == 0
    err = refused(v, token)
    assert err.reason == Reason.UNKNOWN_KID and err.signature_checked is False


def test_key_replaced_under_the_same_kid_is_not_served_from_the_cache() -> None:
    clock = Clock()
    iss, src, v = setup(clock)
    token = iss.mint(SID, AUD, now=T0)
    verify(v, token)
    # same kid, other key material (a broken or malicious publisher): the cached
    # verdict was made with the old key and must not survive
    src.replace(parse_bundle(TD, impostor_bundle(iss)))
    assert len(v.cache) == 0
    err = refused(v, token)
    assert err.reason == Reason.BAD_SIGNATURE
    assert v.signature_checks == 2


def test_stale_generation_is_a_miss_even_without_the_listener() -> None:
    from gateway.identity import VerifiedTokenCache

    cache = VerifiedTokenCache(10, 60, clock=Clock())
    clock = Clock()
    iss, _, v = setup(clock)
    ident = verify(v, iss.mint(SID, AUD, now=T0))
    cache.put("n", ident, (0, 1))
    assert cache.get("n", TD, (0, 1)) is ident
    assert cache.get("n", TD, (0, 2)) is None
    assert cache.get("n", TD, (0, 1)) is None  # dropped on the stale hit
    cache.put("n", ident, (0, 1))
    assert cache.get("n", "other.example", (0, 1)) is None


def test_one_cache_per_verifier_and_audience() -> None:
    clock = Clock()
    iss = DemoIssuer(TD)
    store = TrustBundleStore({TD: StaticBundleSource(parse_bundle(TD, iss.bundle()))})
    public = JwtSvidVerifier(store, AUD, [TD], clock=clock)
    admin = JwtSvidVerifier(store, "prefixgate-admin", [TD], clock=clock)
    token = iss.mint(SID, AUD, now=T0)
    verify(public, token)
    assert len(public.cache) == 1 and len(admin.cache) == 0
    assert refused(admin, token).reason == Reason.AUDIENCE
    assert len(admin.cache) == 0 and admin.signature_checks == 0


def test_unverified_claims_never_accept(decodes: list[str]) -> None:
    clock = Clock()
    iss, _, v = setup(clock)
    token = iss.mint(SID, AUD, now=T0)
    verify(v, token)
    h, p, s = token.split(".")
    # the cached token's header and payload under a forged signature
    err = refused(v, f"{h}.{p}.{b64e(bytes(32) + (1).to_bytes(32, 'big'))}")
    assert err.reason == Reason.BAD_SIGNATURE
    # the same signature bytes spelled with pad bits set: refused before any lookup
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    respelled = s[:-1] + alphabet[alphabet.index(s[-1]) | 0x03]
    if respelled != s:
        err = refused(v, f"{h}.{p}.{respelled}")
        assert err.reason == Reason.MALFORMED and err.signature_checked is False
    # the high-S twin verifies exactly when the token does: it shares the entry
    sig = b64d(s)
    twin = f"{h}.{p}.{b64e(sig[:32] + (N256 - int.from_bytes(sig[32:], 'big')).to_bytes(32, 'big'))}"
    before = len(decodes)
    assert verify(v, twin).spiffe_id == verify(v, token).spiffe_id
    assert len(decodes) == before and len(v.cache) == 1


def test_canonical_name_of_an_out_of_range_s_does_not_crash() -> None:
    iss = DemoIssuer(TD)
    h, p, _ = iss.mint(SID, AUD, now=T0).split(".")
    big_s = f"{h}.{p}.{b64e(bytes(32) + (N256 + 5).to_bytes(32, 'big'))}"
    assert len(canonical_token_sha256(big_s)) == 64
    clock = Clock()
    _, _, v = setup(clock)
    assert refused(v, big_s).reason in (Reason.BAD_SIGNATURE, Reason.UNKNOWN_KID)


def test_cache_bounds() -> None:
    from gateway.identity import VerifiedTokenCache

    clock = Clock()
    iss, _, v = setup(clock, cache_size=3)
    for i in range(10):
        verify(v, iss.mint(SID, AUD, now=T0, jti=str(i)))
    assert len(v.cache) == 3
    # size 0: the cache is off, every request's signature is checked
    off_iss, _, off = setup(clock, cache_size=0)
    token = off_iss.mint(SID, AUD, now=T0)
    verify(off, token)
    verify(off, token)
    assert len(off.cache) == 0 and off.signature_checks == 2
    with pytest.raises(ValueError):
        VerifiedTokenCache(-1)
    with pytest.raises(ValueError):
        VerifiedTokenCache(10, 0)
