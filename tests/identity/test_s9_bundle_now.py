"""Session 9 (issue 14): a verified-token cache hit reads the bundle without awaiting when no refresh
is due, and awaits the source's refresh exactly as before when one is due or the bundle is stale."""
from __future__ import annotations

import asyncio
import math

from gateway.identity import JwtSvidVerifier, TrustBundleStore, parse_bundle
from gateway.identity.bundle_sources import TrustBundleSource
from sim.spiffe_issuer import DemoIssuer
from tests.support.verifier import AUD, T0, Clock, refused, verify

TD = "s9.example"
SID = f"spiffe://{TD}/w"


class _Source(TrustBundleSource):
    """A source whose refresh is due when ``due`` is set; counts its loads; monotonic clock ``now``."""

    def __init__(self, doc: dict, max_stale_s: float = math.inf) -> None:
        self.now = 0.0
        super().__init__(TD, max_stale_s=max_stale_s, clock=lambda: self.now)
        self.doc, self.due, self.loads = doc, False, 0

    def _refresh_due(self, now: float) -> bool:
        return self.due

    async def _load(self, now: float):  # type: ignore[no-untyped-def]
        self.loads += 1
        self.due = False
        return parse_bundle(TD, self.doc)


def _setup(max_stale_s: float = math.inf) -> tuple[DemoIssuer, _Source, JwtSvidVerifier]:
    iss = DemoIssuer(TD)
    src = _Source(iss.bundle(), max_stale_s)
    asyncio.run(src.refresh())
    return iss, src, JwtSvidVerifier(TrustBundleStore({TD: src}), AUD, [TD], clock=Clock(), leeway_s=0)


def test_a_hit_reads_the_bundle_without_awaiting_and_refreshes_when_due() -> None:
    iss, src, v = _setup()
    token = iss.mint(SID, AUD, now=T0)
    assert str(verify(v, token).spiffe_id) == SID
    assert src.loads == 1 and src.current() is not None
    assert str(verify(v, token).spiffe_id) == SID and src.loads == 1  # the hit: no refresh
    src.due = True
    assert src.current() is None  # a refresh due: the awaited path
    assert str(verify(v, token).spiffe_id) == SID and src.loads == 2  # it ran, as before session 9


def test_a_hit_refused_when_the_bundle_is_stale_or_lost_the_key() -> None:
    iss, src, v = _setup(max_stale_s=10)
    token = iss.mint(SID, AUD, now=T0)
    verify(v, token)
    src.now = 11  # stale past max_stale_s, no refresh due: fail closed on the hit too
    assert refused(v, token).reason.value == "bundle_unavailable"
    other = DemoIssuer(TD)
    src.doc, src.due = other.bundle(), True  # the key is gone after the refresh
    assert refused(v, token).reason.value in ("unknown_kid", "invalid_signature")
