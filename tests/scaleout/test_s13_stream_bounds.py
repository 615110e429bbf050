"""Session 13, R13-1: the routing stream is bounded by what it costs (bytes), not by entries.

An entry's size is tenant-driven (whole prefix chains, up to 256 events per entry). Before the
fix a reader took 256 entries in one ``XREAD`` whose reply had to arrive within
``state.command_timeout_s``; a timeout in the rebuild at start made the gateway exit (every new
instance stayed down until the key was deleted), and a long read was applied without a yield.
These tests: a stream whose 256-entry read exceeds the timeout -> the instance still starts and
catches up; an oversized batch -> entries each under the cap, nothing lost, the same index; the
stream is trimmed to its byte budget; a long read yields to the loop between entries.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import redis.asyncio as aioredis

from gateway.config_state import StateConfig
from gateway.shared_bounds import READ_REPLY_BYTES, ReadSizer, read_count, split_bodies, stream_max_len
from gateway.shared_events import decode_events
from gateway.shared_replay import entry_mac, stamp
from gateway.shared_routing import ROUTING_MAC_INFO, RoutingStream
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.shared import BlocksRecorded, LoadDelta, LoadSnapshot, RemoteLoadView, SharedLoadTracker, apply_event
from tests.scaleout.s2_instances import PREFIX, instance, write_secret
from tests.support.waiting import wait_for

KEY = bytes(range(32))
REPLICAS = ["r0", "r1"]


def _keys(n: int, tag: int = 0) -> list[bytes]:
    return [tag.to_bytes(4, "big") + i.to_bytes(12, "big") for i in range(n)]


def _stream(client: aioredis.Redis, instance_id: str, prefix: str = "pgs13:", capacity: int = 100_000,
            **kw: object) -> RoutingStream:
    loads = SharedLoadTracker(InProcessLoadTracker(), RemoteLoadView(), lambda e: None)
    return RoutingStream(client, prefix, instance_id, KEY, InProcessPrefixIndex(capacity), loads, REPLICAS,
                         lease_ttl_s=10, write_interval_s=0, read_interval_s=0, read_block_ms=100, **kw)


def _entry(mac_key: bytes, prefix: str, instance_id: str, body: bytes, seq: int = 1) -> dict[str, bytes | str]:
    """One entry as an instance writes it (gateway/shared_replay.py: the stamp and the MAC; R13-2)."""
    st = stamp(seq, int(time.time() * 1000))
    return {"i": instance_id, "n": st, "b": body, "m": entry_mac(mac_key, prefix, instance_id, st, body)}


async def _fill(client: aioredis.Redis, stream: str, entry: Callable[[int], dict[str, bytes | str]], n: int) -> bytes:
    pipe = client.pipeline(transaction=False)
    for seq in range(1, n + 1):  # a new sequence number each (R13-2: a copy is refused)
        pipe.xadd(stream, entry(seq))
    ids = await pipe.execute()
    return ids[-1]


async def test_a_stream_whose_full_read_exceeds_the_timeout_does_not_stop_the_start(tmp_path: Path,
                                                                                 redis_server) -> None:
    """48 entries of 1 MiB (what an older writer could leave: no entry cap): one ``XREAD COUNT 256``
    carries 48 MB, far over a 0.1 s reply timeout. Before the fix the rebuild raised TimeoutError out
    of ``SharedState.start`` (the gateway exited); now the instance starts and catches up."""
    secret = write_secret(tmp_path / "master.key")
    gw = instance(tmp_path, 0, redis_server.url, secret, command_timeout_s=0.1)
    raw = aioredis.Redis.from_url(redis_server.url)
    chain = _keys(29_000)  # 29,000 x 35 bytes of hex: ~1 MiB of body
    body = orjson.dumps([["b", "r1", [k.hex() for k in chain]]])
    assert len(body) > 1_000_000
    mac_key = gw.keyring.mac_subkeys(ROUTING_MAC_INFO)[0]
    last = await _fill(raw, f"{PREFIX}routing:events", lambda seq: _entry(mac_key, PREFIX, "f" * 16, body, seq), 48)
    try:
        await asyncio.wait_for(gw.shared.start(), 60)  # returns: the instance starts (before: TimeoutError)
        routing = gw.shared.routing
        assert routing is not None
        await wait_for(lambda: routing.last_id == last, timeout_s=60, what="every entry read (catch-up)")
        assert routing.rejected == 0 and routing.applied == 48
        cap = routing._index.capacity_blocks
        assert routing._index.match("r1", chain[:cap]) == cap  # the chain is in the index
    finally:
        await gw.shared.stop()
        await raw.aclose()


async def test_an_oversized_batch_leaves_in_entries_under_the_cap_and_nothing_is_lost(redis_server) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    writer = _stream(client, "w" * 16, entry_max_bytes=4096)
    reader = _stream(client, "r" * 16, capacity=1200)
    big, small = _keys(1000, 1), _keys(50, 2)
    try:
        await writer.tick()  # its lease: the reader keeps its load
        writer.emit(LoadDelta("r0", 7, 0, 1))
        writer.emit(BlocksRecorded("r1", tuple(big)))
        writer.emit(BlocksRecorded("r0", tuple(small)))
        writer.emit(LoadSnapshot({"r0": (7, 0, 1), "r1": (0, 3, 1)}))
        writer.emit(LoadDelta("r1", 0, 2, 1))
        await writer.flush()
        entries = await client.xrange(writer.stream)
        sizes = [len(f[b"b"]) for _, f in entries]
        assert len(entries) >= 9 and max(sizes) <= 4096  # 35 kB of chain: one 4 kB entry before the fix
        await reader.rebuild()
        assert reader.rejected == 0
        assert reader._index.match("r1", big) == 1000 and reader._index.match("r0", small) == 50
        assert reader.remote.total("r0") == (7, 0, 1) and reader.remote.total("r1") == (0, 5, 2)
        # the pieces leave deepest first: the index's LRU order is the whole chain's (root kept longest)
        other = _keys(500, 3)
        writer.emit(BlocksRecorded("r1", tuple(other)))
        await writer.flush()
        await reader.read_once(None)
        assert reader._index.match("r1", big) == 700  # the 300 deepest blocks were evicted, not the root
        assert reader._index.match("r1", other) == 500
    finally:
        await reader.stop()
        await writer.stop()
        await client.aclose()


def test_split_bodies_keep_every_event_in_order_and_pieces_deepest_first() -> None:
    chain = tuple(_keys(300, 4))
    events = [LoadDelta("r0", 1, 2, 3), BlocksRecorded("r1", chain), LoadSnapshot({"r0": (1, 2, 3)})]
    bodies = split_bodies(events, 1024)
    assert all(len(b) <= 1024 for b in bodies) and len(bodies) > 5
    out = [e for b in bodies for e in decode_events(b)]
    assert out[0] == events[0] and out[-1] == events[-1]
    pieces = [e.keys for e in out[1:-1]]
    assert all(isinstance(e, BlocksRecorded) and e.replica_id == "r1" for e in out[1:-1])
    assert [k for p in reversed(pieces) for k in p] == list(chain)  # consecutive pieces, deepest first
    whole, split = InProcessPrefixIndex(400), InProcessPrefixIndex(400)
    whole.record("r1", chain)
    for e in out[1:-1]:
        apply_event(split, RemoteLoadView(), "w", e)
    for idx in (whole, split):
        idx.record("r1", _keys(200, 5))  # evicts the 100 least recently used keys
    assert whole.match("r1", chain) == split.match("r1", chain) == 200
    assert split_bodies(events[:1], 1024) == [orjson.dumps([["d", "r0", 1, 2, 3]])]  # small: one body as before
    assert split_bodies([], 1024) == []


def test_the_bounds_follow_the_byte_budget_and_the_config_defaults() -> None:
    sc = StateConfig()
    assert (sc.stream_entry_max_bytes, sc.stream_max_bytes) == (65_536, 64 << 20)
    assert stream_max_len(sc.stream_max_entries, sc.stream_max_bytes, sc.stream_entry_max_bytes) == 1024
    assert stream_max_len(200, 1 << 30, 65_536) == 200 and stream_max_len(10_000, 1 << 20, 1 << 20) == 16
    assert read_count(65_536, 256) == 16 and read_count(4096, 256) == 256 and read_count(1 << 20, 256) == 1
    assert read_count(sc.stream_entry_max_bytes, 256) * sc.stream_entry_max_bytes <= READ_REPLY_BYTES
    with pytest.raises(ValueError):
        StateConfig(stream_entry_max_bytes=2 << 20)
    with pytest.raises(ValueError):
        StateConfig(stream_max_bytes=1000)
    sizer = ReadSizer(65_536, 256)
    sizer.observed(16, 16, 40 << 20)  # entries of an older writer: 40 MB in one reply
    assert sizer.count == 8
    sizer.failed()
    sizer.failed()
    sizer.failed()
    sizer.failed()
    assert sizer.count == 1
    sizer.observed(1, 1, 1000)  # small replies again: back up, never above the bound
    for _ in range(10):
        sizer.observed(sizer.count, sizer.count, 1000)
    assert sizer.count == 16


async def test_the_stream_is_trimmed_to_its_byte_budget(redis_server) -> None:
    """1 MiB budget, 64 kB entries: MAXLEN ~16 (Redis trims whole 100-entry nodes). Before the fix the
    trim length was stream_max_entries (10,000) whatever the entries weighed."""
    client = aioredis.Redis.from_url(redis_server.url)
    writer = _stream(client, "w" * 16, max_bytes=1 << 20, entry_max_bytes=65_536)
    try:
        for i in range(400):
            writer.emit(LoadDelta("r0", i + 1, 0, 0))
            await writer.flush()
        n = await client.xlen(writer.stream)
        assert 16 <= n <= 200
    finally:
        await writer.stop()
        await client.aclose()


async def test_a_long_read_yields_to_the_loop_between_entries(redis_server) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    writer = _stream(client, "w" * 16)
    reader = _stream(client, "r" * 16)
    seen: set[int] = set()
    try:
        for i in range(16):
            writer.emit(BlocksRecorded("r1", tuple(_keys(200, 10 + i))))
            await writer.flush()
        stop = asyncio.Event()

        async def watch() -> None:
            while not stop.is_set():
                seen.add(reader.applied)
                await asyncio.sleep(0)

        task = asyncio.get_running_loop().create_task(watch())
        assert await reader.read_once(None) == 16
        stop.set()
        await task
        # the watcher ran between entries: it saw the applied count part-way (before: 0, then all 16)
        assert len({v for v in seen if 0 < v < 16}) >= 8
    finally:
        await reader.stop()
        await writer.stop()
        await client.aclose()


async def test_the_state_keys_reach_the_routing_stream(tmp_path: Path, redis_server) -> None:
    """``state.stream_max_bytes`` / ``state.stream_entry_max_bytes`` of a built instance bound its stream."""
    secret = write_secret(tmp_path / "master.key")
    gw = instance(tmp_path, 0, redis_server.url, secret, stream_max_bytes=1 << 20, stream_entry_max_bytes=4096)
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        await gw.shared.start()
        routing = gw.shared.routing
        assert routing is not None
        routing.emit(BlocksRecorded("r1", tuple(_keys(1000, 6))))  # 35 kB of chain: 9 entries of <= 4 kB
        await routing.flush()
        sizes = [len(f[b"b"]) for _, f in await raw.xrange(routing.stream)]
        assert len(sizes) >= 9 and max(sizes) <= 4096
        for i in range(400):  # MAXLEN ~ min(10,000, 1 MiB / 4 KiB = 256): Redis trims whole 100-entry nodes
            routing.emit(LoadDelta("r0", i + 1, 0, 0))
            await routing.flush()
        assert 256 <= await raw.xlen(routing.stream) <= 400
    finally:
        await gw.shared.stop()
        await raw.aclose()
