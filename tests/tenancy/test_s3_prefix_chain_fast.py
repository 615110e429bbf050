"""Session 3: the faster block_hash_chain (ids packed once, HMAC states prepared once per call)
returns byte-identical chains to the documented formula computed with ``hmac.new``."""

from __future__ import annotations

import hashlib
import hmac
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenancy.prefix import block_hash_chain


def reference_chain(key: bytes, tokens: list[int], block_size: int, key_id: str = "",
                    digest_size: int = 16, max_blocks: int | None = None) -> list[bytes]:
    """The chain of issue 1 (before session 3), kept as the specification."""
    n = len(tokens) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    prev = b"pg-prefix-v1" + key_id.encode("utf-8")
    out = []
    for i in range(n):
        block = struct.pack(f">{block_size}I", *tokens[i * block_size:(i + 1) * block_size])
        prev = hmac.new(key, prev + block, hashlib.sha256).digest()[:digest_size]
        out.append(prev)
    return out


@settings(max_examples=300, deadline=None)
@given(
    key=st.binary(min_size=16, max_size=200),  # also keys longer than SHA-256's 64-byte block
    tokens=st.lists(st.integers(0, 2**32 - 1), max_size=300),
    block_size=st.integers(1, 40),
    key_id=st.text(max_size=12).filter(lambda s: not any(0xD800 <= ord(c) < 0xE000 for c in s)),
    digest_size=st.integers(8, 32),
    max_blocks=st.one_of(st.none(), st.integers(-2, 20)),
)
def test_fast_chain_equals_reference(key: bytes, tokens: list[int], block_size: int, key_id: str,
                                     digest_size: int, max_blocks: int | None) -> None:
    got = block_hash_chain(key, tokens, block_size, key_id=key_id, digest_size=digest_size, max_blocks=max_blocks)
    want = reference_chain(key, tokens, block_size, key_id, digest_size, max_blocks)
    assert got == want and all(type(h) is bytes for h in got)


def test_a_tuple_or_range_of_tokens_works_too() -> None:
    key = b"k" * 32
    assert block_hash_chain(key, tuple(range(64)), 16) == reference_chain(key, list(range(64)), 16)
    assert block_hash_chain(key, range(64), 16) == reference_chain(key, list(range(64)), 16)


@pytest.mark.parametrize("bad", [-1, 2**32])
def test_token_out_of_range_raises_struct_error(bad: int) -> None:
    with pytest.raises(struct.error):
        block_hash_chain(b"k" * 32, [1] * 15 + [bad], 16)
