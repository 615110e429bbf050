from __future__ import annotations

import hashlib
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kvcache import KEY_DIGEST_SIZE, BlockCache, block_keys


def _toks(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def test_chain_follows_documented_definition() -> None:
    toks = _toks(40)
    keys = block_keys(toks, 16, "tenant-a")
    assert len(keys) == 2  # the trailing 8-token partial block is not cached
    seed = hashlib.blake2b(b"pg-sim-kv-v1" + b"tenant-a", digest_size=KEY_DIGEST_SIZE).digest()
    k1 = hashlib.blake2b(seed + struct.pack(">16I", *toks[:16]), digest_size=16).digest()
    k2 = hashlib.blake2b(k1 + struct.pack(">16I", *toks[16:32]), digest_size=16).digest()
    assert keys == [k1, k2]


def test_chain_covers_whole_prefix() -> None:
    a = _toks(64)
    b = list(a)
    b[20] = 999_999  # differs inside block 2
    ka, kb = block_keys(a, 16), block_keys(b, 16)
    assert ka[0] == kb[0]
    assert all(x != y for x, y in zip(ka[1:], kb[1:]))  # every later block differs too


def test_salt_isolates_equal_tokens() -> None:
    toks = _toks(64)
    plain = block_keys(toks, 16, None)
    assert block_keys(toks, 16, "") == plain
    a, b = block_keys(toks, 16, "tenant-a"), block_keys(toks, 16, "tenant-b")
    assert not set(a) & set(b)
    assert not set(a) & set(plain)
    cache = BlockCache(100)
    cache.insert(a)
    assert cache.match(b) == 0
    assert cache.match(a) == 4


def test_block_keys_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        block_keys([1, 2], 0)
    with pytest.raises(struct.error):
        block_keys([2**32] * 16, 16)
    assert block_keys([1] * 15, 16) == []


def test_match_counts_leading_blocks_only() -> None:
    keys = block_keys(_toks(80), 16)
    cache = BlockCache(10)
    cache.insert(keys[:2])
    assert cache.match(keys) == 2
    cache.insert([keys[3]])  # a later block alone does not extend the hit
    assert cache.match(keys) == 2
    assert cache.stats.lookups == 2
    assert cache.stats.queried_blocks == 10
    assert cache.stats.hit_blocks == 4


def test_lru_evicts_least_recent_and_tail_first() -> None:
    a = block_keys(_toks(32, 0), 16)       # a0, a1
    b = block_keys(_toks(32, 1000), 16)    # b0, b1
    cache = BlockCache(3)
    assert cache.insert(a) == 2
    assert cache.insert(b) == 2            # over capacity by one: a's tail block goes first
    assert len(cache) == 3 and cache.stats.evicted_blocks == 1
    assert a[1] not in cache and a[0] in cache
    assert cache.match(b) == 2
    cache.insert(a[:1])                    # touch a0: now b1 is the LRU block
    cache.insert(block_keys(_toks(16, 5000), 16))
    assert b[1] not in cache and a[0] in cache and b[0] in cache
    assert cache.usage == pytest.approx(1.0)


def test_insert_larger_than_capacity_keeps_head() -> None:
    keys = block_keys(_toks(16 * 10), 16)
    cache = BlockCache(4)
    cache.insert(keys)
    assert cache.match(keys) == 4
    zero = BlockCache(0)
    assert zero.insert(keys) == 0 and zero.match(keys) == 0


def test_clear_resets_blocks_and_counters() -> None:
    keys = block_keys(_toks(32), 16)
    cache = BlockCache(8)
    cache.insert(keys)
    cache.match(keys)
    cache.clear()
    assert len(cache) == 0 and cache.stats.lookups == 0 and cache.match(keys) == 0


@settings(max_examples=60, deadline=None)
@given(cap=st.integers(0, 12), seqs=st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=6), max_size=20))
def test_capacity_never_exceeded_and_reinsert_hits(cap: int, seqs: list[list[int]]) -> None:
    cache = BlockCache(cap)
    for s in seqs:
        keys = block_keys([t for x in s for t in [x] * 4], 4, None)
        cache.insert(keys)
        assert len(cache) <= cap
        assert cache.match(keys) == min(len(keys), cap)
