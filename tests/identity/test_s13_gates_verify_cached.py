"""Session 13 (issue 14): ``JwtSvidVerifier.verify_cached``, the verified-token cache hit without a
coroutine, answers only what :meth:`verify` would answer from its cache, and fails closed as it does.

The authenticator asks it first and awaits :meth:`verify` when it answers ``None``; these tests hold it
to: no answer for a token never verified or for any other string (another token of the same workload, a
changed signature), the time claims checked against now on every hit, no answer under changed keys or a
refresh due, a refusal for a stale bundle, and :meth:`TrustBundleStore.current_keys` equal to
``current`` + ``generation``.
"""
from __future__ import annotations

import asyncio
import math

import pytest

from gateway.authn import Authenticator
from gateway.errors import GatewayError
from gateway.identity import AuthenticationError, JwtSvidVerifier, TrustBundleStore, parse_bundle
from gateway.identity.bundle_sources import TrustBundleSource
from sim.spiffe_issuer import DemoIssuer
from tests.support.verifier import AUD, T0, Clock, impostor_bundle, make_verifier, verify

TD = "s13.example"
SID = f"spiffe://{TD}/w"


def test_no_answer_before_verification_then_the_same_identity() -> None:
    iss, _src, v = make_verifier(TD, Clock())
    token = iss.mint(SID, AUD, now=T0)
    assert v.verify_cached(token) is None  # never verified: the full check decides
    ident = verify(v, token)
    checks = v.signature_checks
    assert v.verify_cached(token) == ident
    assert v.signature_checks == checks


def test_a_different_token_never_hits() -> None:
    iss, _src, v = make_verifier(TD, Clock())
    token = iss.mint(SID, AUD, now=T0)
    verify(v, token)
    other = iss.mint(SID, AUD, now=T0 - 1)  # the same workload, another token
    assert v.verify_cached(other) is None
    head, _, sig = token.rpartition(".")
    flipped = head + "." + ("A" if sig[0] != "A" else "B") + sig[1:]
    assert v.verify_cached(flipped) is None
    assert v.verify_cached(token + " ") is None and v.verify_cached(token[:-1]) is None


def test_time_claims_are_checked_on_every_hit() -> None:
    clock = Clock()
    iss, _src, v = make_verifier(TD, clock)
    token = iss.mint(SID, AUD, ttl_s=60, now=T0)
    verify(v, token)
    clock.t = T0 + 61  # expired since
    with pytest.raises(AuthenticationError) as ei:
        v.verify_cached(token)
    assert ei.value.reason.value == "expired" and not ei.value.signature_checked


def test_changed_keys_give_no_answer_and_the_full_check_refuses() -> None:
    iss, src, v = make_verifier(TD, Clock())
    token = iss.mint(SID, AUD, now=T0)
    verify(v, token)
    src.replace(parse_bundle(TD, impostor_bundle(iss)))  # same kid, other key material
    assert v.verify_cached(token) is None
    with pytest.raises(AuthenticationError):
        verify(v, token)


class _Source(TrustBundleSource):
    """A source whose refresh is due when ``due`` is set (monotonic clock ``now``)."""

    def __init__(self, doc: dict, max_stale_s: float = math.inf) -> None:
        self.now = 0.0
        super().__init__(TD, max_stale_s=max_stale_s, clock=lambda: self.now)
        self.doc, self.due = doc, False

    def _refresh_due(self, now: float) -> bool:
        return self.due

    async def _load(self, now: float):  # type: ignore[no-untyped-def]
        self.due = False
        return parse_bundle(TD, self.doc)


def test_refresh_due_gives_no_answer_and_a_stale_bundle_is_refused() -> None:
    iss = DemoIssuer(TD)
    src = _Source(iss.bundle(), max_stale_s=10)
    asyncio.run(src.refresh())
    store = TrustBundleStore({TD: src})
    v = JwtSvidVerifier(store, AUD, [TD], clock=Clock(), leeway_s=0)
    token = iss.mint(SID, AUD, now=T0)
    verify(v, token)
    assert v.verify_cached(token) is not None
    src.due = True
    assert v.verify_cached(token) is None  # the awaited path refreshes
    assert store.current_keys(TD, iss.kid) is None
    src.due = False
    src.now = 11  # stale past max_stale_s: fail closed on the hit too
    with pytest.raises(AuthenticationError) as ei:
        v.verify_cached(token)
    assert ei.value.reason.value == "bundle_unavailable"


def test_current_keys_is_current_and_generation() -> None:
    iss, src, v = make_verifier(TD, Clock())
    store = v.store
    got = store.current_keys(TD, iss.kid)
    assert got == (store.current(TD), store.generation(TD))
    assert store.current_keys(TD, "no-such-kid") is None
    with pytest.raises(Exception) as ei:
        store.current_keys("other.example", iss.kid)
    assert type(ei.value).__name__ == "UnknownTrustDomain"


class _Req:
    """The parts of a Starlette request the authenticator reads."""

    def __init__(self, token: str) -> None:
        self.headers = _Headers({"authorization": [f"Bearer {token}"]})
        self.scope = {"client": ("10.0.0.1", 1)}


class _Headers:
    def __init__(self, d: dict[str, list[str]]) -> None:
        self.d = d

    def getlist(self, k: str) -> list[str]:
        return self.d.get(k, [])


def test_authenticator_hit_needs_no_signature_budget_and_a_miss_still_pays() -> None:
    iss, _src, v = make_verifier(TD, Clock())
    asked: list[str] = []

    class _Limiter:
        def blocked(self, source: str, now: float) -> float:
            asked.append(source)
            return 5.0  # this source spent its budget

        def charge_failure(self, source: str, now: float) -> None:
            pass

    auth = Authenticator(v, source_limiter=_Limiter())
    token = iss.mint(SID, AUD, now=T0)
    with pytest.raises(GatewayError) as ei:  # not verified yet: the blocked source gets its 429
        asyncio.run(auth.authenticate(_Req(token)))  # type: ignore[arg-type]
    assert ei.value.status == 429 and asked
    verify(v, token)  # verified elsewhere (another source)
    asked.clear()
    ident = asyncio.run(auth.authenticate(_Req(token)))  # type: ignore[arg-type]
    assert str(ident.spiffe_id) == SID and asked == []  # the hit: no budget asked, no signature
    other = iss.mint(SID, AUD, now=T0 - 2)
    with pytest.raises(GatewayError):
        asyncio.run(auth.authenticate(_Req(other)))  # type: ignore[arg-type]
    assert asked  # another token is a miss: the budget is asked again
