from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from tenancy.keys import KeyRing
from tenancy.salt import SALT_PREFIX, cache_salt, derive_salt_key, length_prefixed

MASTER = b"salt-test-master-secret-0123456789abcdef"


def test_salt_differs_per_tenant_and_is_url_safe() -> None:
    ring = KeyRing(MASTER)
    salts = {ring.cache_salt(t) for t in ("acme", "beta", "gamma")}
    assert len(salts) == 3
    for s in salts:
        assert s.startswith(SALT_PREFIX)
        body = s[len(SALT_PREFIX):]
        assert len(base64.urlsafe_b64decode(body + "=")) == 32
        assert all(c.isalnum() or c in "-_" for c in body)
        assert "acme" not in s and "beta" not in s


def test_salt_stable_across_prefix_key_rotation() -> None:
    ring = KeyRing(MASTER)
    before = ring.cache_salt("acme")
    ring.rotate_tenant("acme")
    assert ring.current("acme").version == 2
    assert ring.cache_salt("acme") == before


def test_salt_changes_on_salt_rotation_only_for_that_tenant() -> None:
    ring = KeyRing(MASTER)
    a0, b0 = ring.cache_salt("acme"), ring.cache_salt("beta")
    assert ring.rotate_salt("acme") == 1
    assert ring.cache_salt("acme") != a0
    assert ring.cache_salt("beta") == b0
    assert ring.current("acme").version == 1  # prefix key unchanged
    assert ring.rotate_salt("acme") == 2


def test_salt_not_derivable_from_name_alone() -> None:
    # Same tenant name, different master: different salt (the name is not the salt input alone).
    assert KeyRing(MASTER).cache_salt("acme") != KeyRing(MASTER[::-1]).cache_salt("acme")


def test_length_prefix_blocks_concatenation_collisions() -> None:
    # Even under one shared key, an unprefixed "tenant || epoch" input collides:
    # ("acme1", epoch 1) and ("acme", epoch 11) both give "acme11".
    key = b"k" * 32

    def naive(tenant: str, epoch: int) -> bytes:
        return hmac.new(key, f"{tenant}{epoch}".encode(), hashlib.sha256).digest()

    assert naive("acme1", 1) == naive("acme", 11)
    assert cache_salt(key, "acme1", 1) != cache_salt(key, "acme", 11)
    assert length_prefixed("ab") != length_prefixed("a") + b"b"


def test_tenant_named_like_other_salt_input_cannot_collide() -> None:
    ring = KeyRing(MASTER)
    target = ring.cache_salt("acme")
    # Names built from acme's salt input, its salt string, or the LoRA-style name.
    evil_names = [
        "acme" + "\x00" * 7 + "\x00",
        "pg-cache-salt-v1acme",
        target,
        "\x00\x00\x00\x04acme",
        "acme/",
    ]
    for name in evil_names:
        for epoch in range(3):
            assert cache_salt(derive_salt_key(MASTER, name), name, epoch) != target


def test_salt_input_validation() -> None:
    with pytest.raises(ValueError):
        cache_salt(b"short", "acme", 0)
    with pytest.raises(ValueError):
        cache_salt(b"k" * 32, "acme", -1)
