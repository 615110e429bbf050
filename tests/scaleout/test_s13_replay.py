"""Session 13, R13-2: a routing stream entry copied verbatim is not applied again.

Before the fix an entry's MAC bound the prefix, the instance id and the body only: whoever can
write to Redis re-added an entry (``XADD`` of the same fields) and every reader applied it again
(one load delta + 50 copies = 51 x the load; copied observations reach the concentration monitor).
Now each entry carries its writer's sequence number and time inside the MAC
(gateway/shared_replay.py); a reader refuses an entry at or below the highest number it applied
from that writer, and an entry older than the stream's retention window. These tests: copies are
refused and counted, an entry moved after a later one of its writer is refused, an old entry is
refused at rebuild (and one inside the window is not), the pieces of a split batch each take the
next number, and the per-writer marks are bounded.
"""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from gateway.shared_alerts import Observed
from gateway.shared_routing import RoutingStream
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.shared import BlocksRecorded, LoadDelta, RemoteLoadView, SharedLoadTracker

KEY = bytes(range(32))
REPLICAS = ["r0", "r1"]


def _stream(client: aioredis.Redis, instance_id: str, **kw: object) -> RoutingStream:
    loads = SharedLoadTracker(InProcessLoadTracker(), RemoteLoadView(), lambda e: None)
    return RoutingStream(client, "pgs13r:", instance_id, KEY, InProcessPrefixIndex(10_000), loads, REPLICAS,
                         lease_ttl_s=10, write_interval_s=0, read_interval_s=0, read_block_ms=100, **kw)


async def _drain(reader: RoutingStream) -> None:
    while await reader.read_once(None):
        pass


async def test_a_verbatim_copy_of_an_entry_is_not_applied_twice(redis_server) -> None:
    """The review's case: one real load delta and 50 copies of its entry. Before: (255000, 0, 51)."""
    client = aioredis.Redis.from_url(redis_server.url)
    writer, reader = _stream(client, "w" * 16), _stream(client, "r" * 16)
    seen: list[Observed] = []
    reader.on_observed = seen.append
    try:
        writer.emit(LoadDelta("r0", 5000, 0, 1))
        writer.emit(Observed("p", "r0", 5000, 5000, 0, "tenant-a"))
        await writer.flush()
        await _drain(reader)
        assert reader.remote.total("r0") == (5000, 0, 1) and len(seen) == 1 and reader.rejected == 0
        ((_, fields),) = await client.xrange(writer.stream)
        for _ in range(50):
            await client.xadd(writer.stream, fields)
        await _drain(reader)
        assert reader.remote.total("r0") == (5000, 0, 1)  # the load once, not 51 times
        assert len(seen) == 1  # a copied observation does not reach the monitor again
        assert reader.rejected == 50
        # a reader starting now (rebuild, oldest first) applies the original once and refuses the copies
        late = _stream(client, "l" * 16)
        await late.rebuild()
        assert late.remote.total("r0") == (5000, 0, 1) and late.rejected == 50
        # the writer's next entry is applied as usual
        writer.emit(LoadDelta("r0", 1, 0, 0))
        await writer.flush()
        await _drain(reader)
        assert reader.remote.total("r0") == (5001, 0, 1) and reader.rejected == 50
    finally:
        await client.aclose()


async def test_an_entry_with_a_lower_sequence_than_one_applied_is_refused(redis_server) -> None:
    """Entry 1 deleted and re-added after entry 2 of the same writer (the stream reordered): a reader
    applies entry 2 and refuses entry 1. Before the fix both were applied."""
    client = aioredis.Redis.from_url(redis_server.url)
    writer = _stream(client, "w" * 16)
    try:
        writer.emit(LoadDelta("r0", 100, 0, 1))
        await writer.flush()
        writer.emit(LoadDelta("r1", 7, 0, 1))
        await writer.flush()
        (first_id, first), (_, second) = await client.xrange(writer.stream)
        await client.xdel(writer.stream, first_id)
        await client.xadd(writer.stream, first)  # now after entry 2
        reader = _stream(client, "r" * 16)
        await reader.rebuild()
        assert reader.remote.total("r1") == (7, 0, 1)
        assert reader.remote.total("r0") == (0, 0, 0)  # entry 1 came after 2: refused
        assert reader.rejected == 1 and reader.applied == 1
        assert first[b"n"].split(b":")[0] == b"1" and second[b"n"].split(b":")[0] == b"2"
    finally:
        await client.aclose()


async def test_an_entry_older_than_the_retention_window_is_refused_at_rebuild(redis_server) -> None:
    """An entry whose writer time is older than (trim length + 128) x lease_ttl_s / 4 (here
    (16 + 128) x 2.5 s = 360 s) is refused by a starting reader, even the first of its writer seen:
    a copy kept after the original was trimmed does not reach a new instance. One inside the
    window is applied. Signed with the key, as a writer would have signed it back then."""
    from gateway.shared_replay import entry_mac, stamp

    client = aioredis.Redis.from_url(redis_server.url)
    reader = _stream(client, "r" * 16, max_entries=16)
    now_ms = int(time.time() * 1000)

    async def add(writer: str, seq: int, sent_ms: int, body: bytes) -> None:
        st = stamp(seq, sent_ms)
        await client.xadd(reader.stream, {"i": writer, "n": st, "b": body,
                                          "m": entry_mac(KEY, "pgs13r:", writer, st, body)})
    try:
        await add("o" * 16, 9, now_ms - 400_000, b'[["d","r0",5000,0,1]]')  # 400 s old
        await add("y" * 16, 3, now_ms - 300_000, b'[["d","r1",20,0,1]]')  # 300 s old: inside
        await reader.rebuild()
        assert reader.remote.total("r0") == (0, 0, 0)
        assert reader.remote.total("r1") == (20, 0, 1)
        assert reader.rejected == 1 and reader.applied == 1
        # an entry without a stamp (a writer before session 13, or a stamp cut off) is refused too
        await client.xadd(reader.stream, {"i": "o" * 16, "b": b'[["d","r0",1,0,0]]', "m": "00" * 32})
        await _drain(reader)
        assert reader.rejected == 2 and reader.remote.total("r0") == (0, 0, 0)
    finally:
        await client.aclose()


async def test_the_pieces_of_a_split_batch_take_consecutive_numbers_and_are_all_applied(redis_server) -> None:
    """R13-1's split (a batch over the entry cap leaves in several entries): each piece is its own entry
    with the next number, in stream order, so a reader applies every piece."""
    client = aioredis.Redis.from_url(redis_server.url)
    writer, reader = _stream(client, "w" * 16, entry_max_bytes=4096), _stream(client, "r" * 16)
    chain = tuple(i.to_bytes(16, "big") for i in range(600))
    try:
        writer.emit(BlocksRecorded("r1", chain))
        writer.emit(LoadDelta("r1", 3, 0, 1))
        await writer.flush()
        entries = await client.xrange(writer.stream)
        seqs = [int(f[b"n"].split(b":")[0]) for _, f in entries]
        assert len(entries) > 1 and seqs == list(range(1, len(entries) + 1))
        await reader.rebuild()
        assert reader.rejected == 0 and reader._index.match("r1", list(chain)) == 600
        assert reader.remote.total("r1") == (3, 0, 1)
    finally:
        await client.aclose()


def test_the_per_writer_marks_are_bounded() -> None:
    """A writer's mark leaves once its last entry is older than the window (its entries are all refused
    as too old by then); beyond ``max_writers`` the least recent leaves first."""
    from gateway.shared_replay import ReplayGuard, parse_stamp

    g = ReplayGuard(max_age_s=60, max_writers=3)
    now = 1_000_000.0
    assert g.refusal("a", 1, int(now * 1000), now) is None
    g.applied("a", 1, int(now * 1000))
    assert g.refusal("a", 1, int(now * 1000), now) == "replayed"
    assert g.refusal("a", 2, int((now - 61) * 1000), now) == "too old"
    g.applied("b", 5, int((now - 30) * 1000))
    assert g.prune(now + 45) == 1 and g.writers() == 1  # b's last entry is 75 s old then; a's 45 s
    assert g.refusal("b", 1, int((now - 30) * 1000), now + 45) == "too old"  # its old ones stay refused
    for w in "cdef":
        g.applied(w, 1, int(now * 1000))
    assert g.writers() == 3
    assert g.refusal("a", 1, int(now * 1000), now) is None  # a was the least recent: evicted
    for bad in ("", "1", "0:5", "-1:5", "1:x", "1:2:3", "9" * 20 + ":1"):
        with pytest.raises(ValueError):
            parse_stamp(bad)
    assert parse_stamp("7:1700000000000") == (7, 1_700_000_000_000)
