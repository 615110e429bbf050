from __future__ import annotations

import pytest

from gateway.identity import StaticBundleSource, TrustBundleStore, parse_bundle
from sim.spiffe_issuer import DemoIssuer


@pytest.fixture(scope="session")
def issuer_a() -> DemoIssuer:
    """ES256 issuer of trust domain a.example."""
    return DemoIssuer("a.example")


@pytest.fixture(scope="session")
def issuer_b() -> DemoIssuer:
    """RS256 issuer of trust domain b.example."""
    return DemoIssuer("b.example", alg="RS256")


@pytest.fixture
def store(issuer_a: DemoIssuer, issuer_b: DemoIssuer) -> TrustBundleStore:
    """A store with static bundles of both domains."""
    return TrustBundleStore(
        {
            "a.example": StaticBundleSource(parse_bundle("a.example", issuer_a.bundle())),
            "b.example": StaticBundleSource(parse_bundle("b.example", issuer_b.bundle())),
        }
    )
