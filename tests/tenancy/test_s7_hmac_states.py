"""Issue 14 (session 7): the prefix chain's HMAC pad states are kept per key and the audit
fingerprint's HMAC is two one-shot SHA-256 calls; both byte-identical to ``hmac.new``."""

from __future__ import annotations

import hashlib
import hmac
import struct

from hypothesis import given, settings
from hypothesis import strategies as st

import tenancy.prefix
from gateway.prefix_keys import ChainView, PrefixKeys
from tenancy.keys import PrefixChains
from tenancy.prefix import block_hash_chain, hmac_sha256

KEYS = st.binary(min_size=16, max_size=130)


def _reference(key: bytes, tokens: list[int], block: int, kid: str) -> list[bytes]:
    prev, out = b"pg-prefix-v1" + kid.encode(), []
    for i in range(len(tokens) // block):
        prev = hmac.new(key, prev + struct.pack(f">{block}I", *tokens[i * block:(i + 1) * block]),
                        hashlib.sha256).digest()[:16]
        out.append(prev)
    return out


@settings(max_examples=200, deadline=None)
@given(key=KEYS, tokens=st.lists(st.integers(0, 2**32 - 1), max_size=40), kid=st.sampled_from(["", "v1", "v2"]))
def test_chain_equals_hmac_new_also_from_the_kept_states(key: bytes, tokens: list[int], kid: str) -> None:
    want = _reference(key, tokens, 4, kid)
    assert block_hash_chain(key, tokens, 4, key_id=kid) == want
    assert block_hash_chain(key, tokens, 4, key_id=kid) == want  # the second call copies the kept states


def test_the_kept_states_are_bounded() -> None:
    for i in range(tenancy.prefix.PAD_STATES_MAX + 5):
        block_hash_chain(i.to_bytes(16, "big"), [1, 2], 2)
    assert len(tenancy.prefix._pads) <= tenancy.prefix.PAD_STATES_MAX


@settings(max_examples=300, deadline=None)
@given(key=st.binary(max_size=130), msg=st.binary(max_size=100))
def test_hmac_sha256_equals_hmac_new(key: bytes, msg: bytes) -> None:
    assert hmac_sha256(key, msg) == hmac.new(key, msg, hashlib.sha256).digest()


@given(first=st.binary(min_size=16, max_size=16))
def test_fingerprint_is_unchanged(first: bytes) -> None:
    view = ChainView(PrefixChains(current=(first,), kid="v1", previous=()))
    want = hmac.new(first, b"pg-audit-fp-v1", hashlib.sha256).hexdigest()[:16]
    assert PrefixKeys.prefix_fingerprint(view) == want
