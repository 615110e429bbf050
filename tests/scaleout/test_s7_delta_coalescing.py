"""Load deltas of one routing stream entry are summed per replica (session 7, gateway/shared_events.py).

A request emits three deltas (dispatch, first byte, end); an entry holding
whole requests sends their sum, which a reader applies as it applied the
deltas one by one (it applies an entry in one go). Snapshots stay barriers.
"""
from __future__ import annotations

import os
import random

import redis.asyncio as aioredis

from gateway.shared_alerts import Observed
from gateway.shared_events import coalesce_deltas, decode_events
from gateway.shared_routing import RoutingStream
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.shared import BlocksRecorded, LoadDelta, LoadSnapshot, RemoteLoadView, SharedLoadTracker, apply_event

KEY = os.urandom(32)


def test_a_whole_request_leaves_no_delta_and_other_events_keep_their_order() -> None:
    blocks, obs = BlocksRecorded("r0", (b"k",)), Observed("default", "r0", 10, 20, 10, "acme")
    events = [LoadDelta("r0", 10, 4, 1), blocks, LoadDelta("r0", -10, 0, 0), obs, LoadDelta("r0", 0, -4, -1),
              LoadDelta("r1", 7, 1, 1)]
    assert coalesce_deltas(events) == [blocks, obs, LoadDelta("r1", 7, 1, 1)]


def test_a_snapshot_is_a_barrier() -> None:
    snap = LoadSnapshot({"r0": (1, 1, 1)})
    events = [LoadDelta("r0", 5, 0, 1), LoadDelta("r0", 1, 0, 0), snap, LoadDelta("r0", -5, 0, -1)]
    assert coalesce_deltas(events) == [LoadDelta("r0", 6, 0, 1), snap, LoadDelta("r0", -5, 0, -1)]


def test_applying_the_sums_gives_the_view_applying_each_delta_gives() -> None:
    """Random request lifecycles cut into entries at random points: after every entry the
    receiver's view of the sender is the same with and without coalescing."""
    rng = random.Random(7)
    one, each = RemoteLoadView(), RemoteLoadView()
    open_reqs: list[tuple[str, int, int, bool]] = []
    for _ in range(200):  # entries
        entry = []
        for _ in range(rng.randint(0, 12)):
            k = rng.random()
            if k < 0.4 or not open_reqs:
                r = (rng.choice(["r0", "r1", "r2"]), rng.randint(1, 500), rng.randint(1, 50), False)
                open_reqs.append(r)
                entry.append(LoadDelta(r[0], r[1], r[2], 1))
            elif k < 0.7:
                i = rng.randrange(len(open_reqs))
                rid, p, d, fb = open_reqs[i]
                if not fb:
                    open_reqs[i] = (rid, p, d, True)
                    entry.append(LoadDelta(rid, -p, 0, 0))
            else:
                rid, p, d, fb = open_reqs.pop(rng.randrange(len(open_reqs)))
                entry.append(LoadDelta(rid, 0 if fb else -p, -d, -1))
            if rng.random() < 0.05:
                entry.append(BlocksRecorded("r0", (b"x",)))
        idx = InProcessPrefixIndex(100)
        for e in entry:
            apply_event(idx, each, "a", e)
        for e in coalesce_deltas(entry):
            apply_event(idx, one, "a", e)
        assert [one.total(r) for r in ("r0", "r1", "r2")] == [each.total(r) for r in ("r0", "r1", "r2")]


async def test_a_stream_entry_of_whole_requests_carries_no_load_delta(redis_server) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    remote = RemoteLoadView()
    loads = SharedLoadTracker(InProcessLoadTracker(), remote, lambda e: a.emit(e))
    a = RoutingStream(client, "pgs7:", "a" * 16, KEY, InProcessPrefixIndex(1000), loads, ["r0", "r1"],
                      lease_ttl_s=10, write_interval_s=0.05)
    try:
        await a.start()
        await a.flush()
        start = len(await client.xrange(a.stream))
        for _ in range(20):  # dispatch, first byte and end in one loop tick: one entry
            t = loads.dispatch("r0", 100, 10)
            t.first_byte()
            t.finish()
        a.emit(BlocksRecorded("r0", (b"k1",)))
        await a.flush()
        entries = (await client.xrange(a.stream))[start:]
        events = [e for _, f in entries for e in decode_events(f[b"b"])]
        # (the lease task's snapshot may be there too; it cannot fall between deltas emitted in one tick)
        assert [e for e in events if not isinstance(e, LoadSnapshot)] == [BlocksRecorded("r0", (b"k1",))]
    finally:
        await a.stop()
        await client.aclose()
