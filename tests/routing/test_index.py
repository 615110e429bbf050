from __future__ import annotations

import pytest

from routing.index import InProcessPrefixIndex
from tenancy.prefix import block_hash_chain

KEY_A = b"a" * 32
KEY_B = b"b" * 32


def chain(key: bytes, tokens: list[int], key_id: str = "k1") -> list[bytes]:
    return block_hash_chain(key, tokens, 4, key_id=key_id)


def test_match_counts_leading_blocks() -> None:
    idx = InProcessPrefixIndex(100)
    keys = chain(KEY_A, list(range(16)))  # 4 blocks
    idx.record("r1", keys[:3])
    assert idx.match("r1", keys) == 3
    assert idx.match("r2", keys) == 0
    # A different prefix diverging at block 1 matches only block 0.
    other = chain(KEY_A, list(range(4)) + [99] * 12)
    assert idx.match("r1", other) == 1


def test_match_many_agrees_with_match() -> None:
    idx = InProcessPrefixIndex(100)
    keys = chain(KEY_A, list(range(20)))
    idx.record("r1", keys[:2])
    idx.record("r2", keys)
    idx.record("r3", chain(KEY_A, [7] * 20))
    got = idx.match_many(keys, ["r1", "r2", "r3", "r4"])
    assert got == {rid: idx.match(rid, keys) for rid in ["r1", "r2", "r3", "r4"]}
    assert got == {"r1": 2, "r2": 5, "r3": 0, "r4": 0}


def test_lru_eviction_keeps_recent_and_roots() -> None:
    idx = InProcessPrefixIndex(4)
    a = chain(KEY_A, [1] * 12)  # 3 blocks
    b = chain(KEY_A, [2] * 12)  # 3 blocks
    idx.record("r", a)
    idx.record("r", b)  # 6 > 4: evict 2 least recent, a's tail first
    assert idx.match("r", b) == 3
    assert idx.match("r", a) == 1  # a's root survives, its deepest blocks went first
    assert idx.replica_blocks("r") == 4
    assert idx.stats().evictions == 2
    idx.record("r", a[:1])  # touch a's root: b's tail is now oldest
    idx.record("r", chain(KEY_A, [3] * 4))
    assert idx.match("r", a) == 1
    assert idx.match("r", b) == 2


def test_forget_replica() -> None:
    idx = InProcessPrefixIndex(10)
    keys = chain(KEY_A, list(range(8)))
    idx.record("r1", keys)
    idx.record("r2", keys)
    idx.forget_replica("r1")
    assert idx.match("r1", keys) == 0
    assert idx.match_many(keys, ["r1", "r2"]) == {"r1": 0, "r2": 2}
    idx.forget_replica("r2")
    assert idx.stats().distinct_keys == 0


def test_tenant_and_key_version_isolation() -> None:
    idx = InProcessPrefixIndex(100)
    tokens = list(range(16))
    idx.record("r1", chain(KEY_A, tokens))
    assert idx.match("r1", chain(KEY_B, tokens)) == 0  # other tenant, same prompt
    assert idx.match("r1", chain(KEY_A, tokens, key_id="k2")) == 0  # same tenant, new key version
    assert idx.match("r1", chain(KEY_A, tokens)) == 4


def test_bad_capacity() -> None:
    with pytest.raises(ValueError):
        InProcessPrefixIndex(0)
