"""Issue 14, the verified-token cache's hit path: a repeat of an exact token string
skips decoding it (the cache's spelling memo) but never skips a check.

On the fast path the verifier still refuses a token that expired since it was
cached, one not yet valid, one whose trust domain's keys changed (listener or
not: the keys version is compared), one whose key was removed; and it decodes
a repeated string only once.
"""

from __future__ import annotations

import functools
from typing import Any

import pytest

import gateway.identity.jwtsvid as jwtsvid_mod
from gateway.identity import Reason, VerifiedTokenCache, parse_bundle
from tests.support.verifier import AUD, T0, Clock, impostor_bundle, make_verifier, refused, verify

TD = "fast.example"
SID = f"spiffe://{TD}/ns/t/sa/app"


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every token the verifier decodes (parse_token calls)."""
    calls: list[str] = []
    real = jwtsvid_mod.parse_token

    def spy(token: str, **kw: Any) -> Any:
        calls.append(token)
        return real(token, **kw)

    monkeypatch.setattr(jwtsvid_mod, "parse_token", spy)
    return calls


setup = functools.partial(make_verifier, TD)


def test_a_repeated_token_is_decoded_once(parses: list[str]) -> None:
    clock = Clock()
    iss, _, v = setup(clock)
    token = iss.mint(SID, AUD, now=T0)
    first = verify(v, token)
    for _ in range(5):
        assert verify(v, token) is first
    assert parses == [token] and v.signature_checks == 1


def test_expired_since_cached_is_refused_on_the_fast_path(parses: list[str]) -> None:
    clock = Clock()
    iss, _, v = setup(clock, leeway_s=5)
    token = iss.mint(SID, AUD, now=T0, ttl_s=30)
    verify(v, token)
    clock.t = T0 + 34.9
    verify(v, token)
    assert v.cache.spelling(token) is not None
    clock.t = T0 + 35  # exp + leeway
    assert refused(v, token).reason == Reason.EXPIRED
    assert v.signature_checks == 1


def test_not_yet_valid_is_refused_on_the_fast_path(parses: list[str]) -> None:
    clock = Clock()
    iss, _, v = setup(clock)
    token = iss.mint(SID, AUD, now=T0, ttl_s=60)
    verify(v, token)
    clock.t = T0 - 10  # the clock stepped back before the token's nbf/iat
    assert refused(v, token).reason == Reason.NOT_YET_VALID


def test_removed_key_is_refused_on_the_fast_path() -> None:
    clock = Clock()
    iss, src, v = setup(clock)
    token = iss.mint(SID, AUD, now=T0)
    verify(v, token)
    iss.rotate()
    iss.drop_old()
    src.replace(parse_bundle(TD, iss.bundle()))
    err = refused(v, token)
    assert err.reason == Reason.UNKNOWN_KID and err.signature_checked is False


def test_keys_changed_without_the_listener_is_a_miss_on_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # the verifier registers the cache's listener at construction: make it a no-op first,
    # so only the keys-version comparison can refuse the cached verdict
    monkeypatch.setattr(VerifiedTokenCache, "clear_trust_domain", lambda self, td, gen=None: 0)
    clock = Clock()
    iss, src, v = setup(clock)
    token = iss.mint(SID, AUD, now=T0)
    verify(v, token)
    src.replace(parse_bundle(TD, impostor_bundle(iss)))  # same kid, other key: the cached verdict is void
    assert v.cache.spelling(token) is not None
    err = refused(v, token)
    assert err.reason == Reason.BAD_SIGNATURE and v.signature_checks == 2


def test_spelling_memo_is_bounded() -> None:
    clock = Clock()
    iss, _, v = setup(clock, cache_size=2)
    tokens = [iss.mint(SID, AUD, now=T0, jti=str(i)) for i in range(5)]
    for t in tokens:
        verify(v, t)
    assert sum(v.cache.spelling(t) is not None for t in tokens) <= 2
    for t in tokens:  # every token still verifies (evicted ones by their signature)
        verify(v, t)
