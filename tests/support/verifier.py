"""A JWT-SVID verifier over one static trust bundle, for the verified-token cache tests (issues 12, 14).

:func:`make_verifier` gives a :class:`sim.spiffe_issuer.DemoIssuer`, its
:class:`gateway.identity.StaticBundleSource` (replace its bundle to change the
keys) and a :class:`gateway.identity.JwtSvidVerifier` for audience :data:`AUD`
on a settable :class:`Clock`; :func:`verify` and :func:`refused` run one
verification; :func:`impostor_bundle` is the issuer's bundle with other key
material under the same key id.
"""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.identity import AuthenticationError, JwtSvidVerifier, StaticBundleSource, TrustBundleStore, parse_bundle
from sim.spiffe_issuer import DemoIssuer

__all__ = ["AUD", "T0", "Clock", "impostor_bundle", "make_verifier", "refused", "verify"]

AUD = "prefixgate"
#: The tests' start time, epoch seconds.
T0 = 1_900_000_000.0


class Clock:
    """A clock for the verifier: returns ``t`` (epoch seconds, :data:`T0` at first); set ``t`` to move it."""

    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make_verifier(td: str, clock: Clock, alg: str = "ES256",
                  **kw: Any) -> tuple[DemoIssuer, StaticBundleSource, JwtSvidVerifier]:
    """An issuer of trust domain ``td`` (``alg``), its static bundle source and a verifier that trusts
    only ``td`` for :data:`AUD` on ``clock``; ``kw`` go to the verifier (``leeway_s`` 0 unless given)."""
    iss = DemoIssuer(td, alg=alg)
    src = StaticBundleSource(parse_bundle(td, iss.bundle()))
    kw.setdefault("leeway_s", 0)
    return iss, src, JwtSvidVerifier(TrustBundleStore({td: src}), AUD, [td], clock=clock, **kw)


def verify(v: JwtSvidVerifier, token: str, **kw: Any) -> Any:
    """``v.verify(token, **kw)`` run to completion; raises what it raises."""
    return asyncio.run(v.verify(token, **kw))


def refused(v: JwtSvidVerifier, token: str, **kw: Any) -> AuthenticationError:
    """The :class:`AuthenticationError` ``v.verify(token, **kw)`` raises (the test fails if it accepts)."""
    with pytest.raises(AuthenticationError) as ei:
        asyncio.run(v.verify(token, **kw))
    return ei.value


def impostor_bundle(iss: DemoIssuer) -> dict[str, Any]:
    """``iss``'s bundle document with one key of another issuer published under ``iss.kid``
    (a broken or malicious publisher), its ``spiffe_sequence`` one higher."""
    jwk = DemoIssuer(iss.trust_domain).public_jwk()
    jwk["kid"] = iss.kid
    bundle = iss.bundle()
    bundle["keys"] = [jwk]
    bundle["spiffe_sequence"] += 1
    return bundle
