"""Deriving a tenant's keys from the master secret: prefix keys, key ids, user pseudonyms (pure functions and value types).

Derivation (RFC 5869 HKDF-SHA256, fixed application salt
``b"prefixgate-hkdf-v1"``)::

    prefix_key(T, v) = HKDF(master, info=b"pg-tenant-prefix-key-v1" || u32(len T) || T || u64(v))
    kid(T, v)        = "t:<T>:v<v>:" || hex(HMAC-SHA256(prefix_key, b"pg-kid-v1")[:6])

The key id (kid) is public: it names a key in logs, audit events and the
prefix index without revealing it (a truncated one-way MAC of the key, not
the key). The kid is the ``key_id`` seed of :func:`tenancy.prefix.block_hash_chain`,
so chains of two key versions never collide.

User pseudonyms (the OpenAI ``user`` field sent upstream in place of the
client's own, when configured)::

    user_key(T) = HKDF(master, info=b"pg-user-pseudonym-key-v1" || u32(len T) || T)
    pseudonym   = "pgu1_" || base64url(HMAC-SHA256(user_key(T), b"pg-user-v1" || u32(len S) || S)[:18])

for tenant ``T`` and workload SPIFFE ID ``S``: stable across prefix-key
rotations and salt epochs (its own HKDF label, no version), different per
workload and per tenant; it changes only with the master secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct
from dataclasses import dataclass, field

from tenancy.salt import hkdf_sha256, length_prefixed

#: HKDF ``info`` label of per-tenant prefix keys.
PREFIX_KEY_INFO = b"pg-tenant-prefix-key-v1"
#: HKDF ``info`` label of per-tenant user-pseudonym keys.
USER_KEY_INFO = b"pg-user-pseudonym-key-v1"
_USER_LABEL = b"pg-user-v1"
_USER_PREFIX = "pgu1_"
_KID_LABEL = b"pg-kid-v1"
_KID_FP_BYTES = 6


def derive_prefix_key(master_secret: bytes, tenant_id: str, version: int) -> bytes:
    """Return the 32-byte prefix key of ``tenant_id`` at key ``version`` (>= 1)."""
    if version < 1:
        raise ValueError("key version must be >= 1")
    info = PREFIX_KEY_INFO + length_prefixed(tenant_id) + struct.pack(">Q", version)
    return hkdf_sha256(master_secret, info)


def key_id(tenant_id: str, version: int, key: bytes) -> str:
    """Return the public key id ``t:<tenant>:v<version>:<12 hex>`` of ``key``.

    The fingerprint is the first 6 bytes of ``HMAC-SHA256(key, b"pg-kid-v1")``:
    one-way, so the kid reveals nothing about the key.
    """
    fp = hmac.new(key, _KID_LABEL, hashlib.sha256).digest()[:_KID_FP_BYTES].hex()
    return f"t:{tenant_id}:v{version}:{fp}"


def user_pseudonym(master_secret: bytes, tenant_id: str, spiffe_id: str) -> str:
    """Return the stable pseudonym of workload ``spiffe_id`` of ``tenant_id`` (see module doc).

    ``"pgu1_"`` + 24 URL-safe base64 characters (144 bits of HMAC-SHA256);
    one-way: it names the workload to a replica without revealing it.
    """
    key = hkdf_sha256(master_secret, USER_KEY_INFO + length_prefixed(tenant_id))
    mac = hmac.new(key, _USER_LABEL + length_prefixed(spiffe_id), hashlib.sha256).digest()[:18]
    return _USER_PREFIX + base64.urlsafe_b64encode(mac).decode("ascii")


@dataclass(frozen=True)
class TenantKey:
    """One version of a tenant's prefix key. ``repr`` hides the key bytes."""

    tenant_id: str
    version: int
    kid: str
    key: bytes = field(repr=False)


@dataclass(frozen=True)
class PrefixChains:
    """Block-hash chains of one prompt under a tenant's keys.

    ``current`` is the chain under the current key (kid ``kid``); the router
    indexes this one. ``previous`` holds ``(kid, chain)`` for each older key
    version still in its grace period, newest first; the router only looks
    these up (to keep locality across a rotation), never inserts them.
    Each chain is a tuple of ``digest_size``-byte hashes, one per full block.
    Its ``__init__`` fills the instance dictionary directly (one per request: issue 14, session 23,
    as :mod:`routing.types`); fields, equality, hash and repr are the frozen dataclass's own
    (tests/routing/test_s23_value_init.py).
    """

    kid: str
    current: tuple[bytes, ...]
    previous: tuple[tuple[str, tuple[bytes, ...]], ...] = ()

    def __init__(self, kid: str, current: tuple[bytes, ...],
                 previous: tuple[tuple[str, tuple[bytes, ...]], ...] = ()) -> None:
        d = self.__dict__  # = the frozen dataclass's __init__, without object.__setattr__ per field
        d["kid"] = kid
        d["current"] = current
        d["previous"] = previous
