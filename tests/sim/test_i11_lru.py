"""Issue 11 item 4: the simulator's block cache and the per-source limiter use
cachetools' LRUCache; these pin the least-recently-used behaviour against a
reference model (the hand-written OrderedDict they replaced)."""

from __future__ import annotations

from collections import OrderedDict

import pytest
from hypothesis import given, settings, strategies as st

from sim.kvcache import BlockCache
from tenancy.limits import RateLimited
from tenancy.source_limits import SourceLimiter


class _Reference:
    def __init__(self, cap: int) -> None:
        self.cap, self.lru = cap, OrderedDict()

    def insert(self, keys: list[bytes]) -> tuple[int, int]:
        if self.cap == 0 or not keys:
            return 0, 0
        new = 0
        for k in reversed(keys[: self.cap]):
            if k in self.lru:
                self.lru.move_to_end(k)
            else:
                self.lru[k] = None
                new += 1
        ev = 0
        while len(self.lru) > self.cap:
            self.lru.popitem(last=False)
            ev += 1
        return new, ev


_keys = st.lists(st.sampled_from([bytes([i]) for i in range(12)]), max_size=8, unique=True)


@settings(max_examples=300, deadline=None)
@given(cap=st.integers(0, 6), ops=st.lists(st.tuples(st.booleans(), _keys), max_size=30))
def test_block_cache_matches_reference_lru(cap: int, ops: list[tuple[bool, list[bytes]]]) -> None:
    cache, ref = BlockCache(cap), _Reference(cap)
    for is_insert, keys in ops:
        if is_insert:
            before = cache.stats.evicted_blocks
            new, ev = ref.insert(keys)
            assert cache.insert(keys) == new
            assert cache.stats.evicted_blocks - before == ev
        else:
            hit = 0
            for k in keys:
                if k not in ref.lru:
                    break
                hit += 1
            assert cache.match(keys) == hit  # a lookup does not touch the order
        assert set(ref.lru) == {k for k in ref.lru if k in cache} and len(cache) == len(ref.lru)


def test_source_limiter_evicts_least_recently_used_source() -> None:
    lim = SourceLimiter(rate=0.001, burst=1, max_sources=2)
    lim.check("10.0.0.1", now=0.0)
    lim.check("10.0.0.2", now=0.0)
    with pytest.raises(RateLimited):  # touches .1: .2 is now the least recent
        lim.check("10.0.0.1", now=0.0)
    lim.check("10.0.0.3", now=0.0)  # evicts .2
    assert len(lim) == 2
    with pytest.raises(RateLimited):  # .1 kept its empty bucket
        lim.check("10.0.0.1", now=0.0)
    lim.check("10.0.0.2", now=0.0)  # .2 was forgotten: a fresh bucket
