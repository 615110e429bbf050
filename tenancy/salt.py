"""Per-tenant cache salt sent upstream as vLLM's ``cache_salt`` request field.

vLLM mixes ``cache_salt`` into the hash of the first KV block, so requests
with different salts never share prefix-cache blocks on a replica. The salt
must be unguessable and impossible for one tenant to construct for another:
vLLM issue #44701 shows that an unprefixed, name-derived salt can collide with
a LoRA adapter name chosen by another tenant. So the salt is

    salt_key_T = HKDF-SHA256(master, salt=b"prefixgate-hkdf-v1",
                             info=b"pg-cache-salt-key-v1" || u32(len T) || T)
    mac        = HMAC-SHA256(salt_key_T,
                             b"pg-cache-salt-v1" || u32(len T) || T || u64(epoch))
    cache_salt = "pgs1_" + base64url(mac) (no padding, 48 characters)

The tenant name only enters *under* the tenant's own secret key and always
length-prefixed, so no choice of tenant name, adapter name or epoch lets one
tenant reproduce another's salt without the master secret. The salt has its
own epoch, separate from the prefix-key version, so rotating a tenant's
prefix key keeps the replica cache warm; bumping the epoch (an operator
action) turns that tenant's replica cache cold on purpose.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = [
    "HKDF_SALT",
    "SALT_KEY_INFO",
    "SALT_DOMAIN",
    "SALT_PREFIX",
    "length_prefixed",
    "hkdf_sha256",
    "derive_salt_key",
    "cache_salt",
]

#: Fixed HKDF salt (RFC 5869 §3.1: an application-wide, non-secret salt).
HKDF_SALT = b"prefixgate-hkdf-v1"
#: HKDF ``info`` label of the per-tenant salt key.
SALT_KEY_INFO = b"pg-cache-salt-key-v1"
#: Domain-separation label of the salt MAC input.
SALT_DOMAIN = b"pg-cache-salt-v1"
#: Visible, versioned prefix of every salt string.
SALT_PREFIX = "pgs1_"


def length_prefixed(value: str) -> bytes:
    """Return ``u32be(len(utf8(value))) || utf8(value)``: an injective encoding.

    Raises :class:`ValueError` for a value longer than 2**32-1 bytes.
    """
    raw = value.encode("utf-8")
    if len(raw) >= 1 << 32:
        raise ValueError("value too long to length-prefix")
    return struct.pack(">I", len(raw)) + raw


def hkdf_sha256(ikm: bytes, info: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 (RFC 5869) of ``ikm`` with the fixed :data:`HKDF_SALT`.

    ``length`` is in bytes. Thin wrapper over :mod:`cryptography`'s HKDF.
    """
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=HKDF_SALT, info=info).derive(ikm)


def derive_salt_key(master_secret: bytes, tenant_id: str) -> bytes:
    """Return the 32-byte per-tenant salt key derived from the master secret.

    Independent of the tenant's prefix-key version (different HKDF ``info``).
    """
    return hkdf_sha256(master_secret, SALT_KEY_INFO + length_prefixed(tenant_id))


def cache_salt(salt_key: bytes, tenant_id: str, epoch: int) -> str:
    """Return the URL-safe cache salt string of ``tenant_id`` at ``epoch``.

    ``epoch`` is a non-negative integer below 2**64; raises :class:`ValueError`
    otherwise or when ``salt_key`` is shorter than 16 bytes.
    """
    if len(salt_key) < 16:
        raise ValueError("salt key must be at least 16 bytes")
    if not 0 <= epoch < 1 << 64:
        raise ValueError("salt epoch must be within 0..2**64-1")
    msg = SALT_DOMAIN + length_prefixed(tenant_id) + struct.pack(">Q", epoch)
    mac = hmac.new(salt_key, msg, hashlib.sha256).digest()
    return SALT_PREFIX + base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")
