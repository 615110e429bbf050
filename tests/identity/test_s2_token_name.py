"""The verifier names a token in its cache from the parts it already parsed (no second
header decode): that name is canonical_token_sha256(token), for every algorithm and
for ECDSA twins (a twin of a verified token is a cache hit, no signature check)."""
from __future__ import annotations

import pytest

from gateway.identity import canonical_token_sha256
from tests.identity.test_i10_ecdsa_twins import twin
from tests.identity.test_i12_token_cache import AUD, SID, T0, TD, Clock, setup, verify


@pytest.mark.parametrize("alg", ["ES256", "ES384", "ES512", "RS256", "PS256"])
def test_cache_name_is_the_canonical_name(alg: str) -> None:
    iss, _, v = setup(Clock(), alg=alg)
    for i in range(6):
        token = iss.mint(SID, AUD, now=T0, jti=f"j{i}")
        verify(v, token)
        assert v.cache.get(canonical_token_sha256(token), TD, v.store.generation(TD)) is not None
        if alg.startswith("ES"):
            checks = v.signature_checks
            verify(v, twin(token, alg)[0])  # the twin shares the name: answered from the cache
            assert v.signature_checks == checks
    assert len(v.cache) == 6
