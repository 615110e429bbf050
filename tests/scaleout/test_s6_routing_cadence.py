"""Routing stream cadence (session 6, gateway/shared_routing.py "Cadence"): under load one ``XADD``
carries many events and one ``XREAD`` returns many entries; an idle reader's blocking ``XREAD``
ends before the client's reply timeout; MACs and encodings stay what older instances read."""
from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.shared_alerts import Observed
from gateway.shared_replay import stamp
from gateway.shared_routing import RoutingStream, decode_events, encode_events
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.shared import BlocksRecorded, LoadDelta, LoadSnapshot, RemoteLoadView, SharedLoadTracker
from tenancy.salt import length_prefixed
from tests.scaleout.s2_instances import shared_instances
from tests.support.waiting import wait_for

KEY = os.urandom(32)
REPLICAS = ["r0", "r1"]


def _stream(client: aioredis.Redis, instance: str, **kw: object) -> RoutingStream:
    loads = SharedLoadTracker(InProcessLoadTracker(), RemoteLoadView(), lambda e: None)
    return RoutingStream(client, "pgs6:", instance, KEY, InProcessPrefixIndex(1000), loads, REPLICAS,
                         lease_ttl_s=10, **kw)


async def test_events_emitted_over_many_loop_ticks_leave_in_few_entries(redis_server) -> None:
    """100 events 2 ms apart: at most one XADD per write interval (50 ms here), not one per event."""
    client = aioredis.Redis.from_url(redis_server.url)
    a = _stream(client, "a" * 16, write_interval_s=0.05)
    try:
        await a.start()
        t0 = time.monotonic()
        for i in range(100):
            a.emit(LoadDelta("r0", i, 0, 1))
            await asyncio.sleep(0.002)
        await wait_for(lambda: not a._queue, what="queue drained")
        elapsed = time.monotonic() - t0
        await a.stop()
        entries = await client.xrange(a.stream)
        events = [e for _, f in entries for e in decode_events(f[b"b"])]
        # all of them (session 7: the deltas of one entry leave summed per replica, gateway/shared_events.py)
        deltas = [e for e in events if isinstance(e, LoadDelta)]
        assert sum(e.prefill_tokens for e in deltas) == sum(range(100))
        assert sum(e.running_requests for e in deltas) == 100
        # the lease tick's snapshot entry is one more
        assert a.writes <= elapsed / 0.05 + 3, (a.writes, elapsed)
    finally:
        await client.aclose()


async def test_a_busy_reader_takes_many_entries_per_read(redis_server) -> None:
    """60 entries written 2 ms apart by another instance: all applied, with at most one
    XREAD that found entries per read interval (50 ms here)."""
    client = aioredis.Redis.from_url(redis_server.url)
    writer = _stream(client, "w" * 16, write_interval_s=0)
    # session 13 (R13-1): a read takes 1 MiB / the entry cap entries; a 4 KiB cap keeps the old 256, so
    # every entry waiting after an interval fits one read (with the 64 KiB default: 16, and a full
    # read is followed by another at once)
    reader = _stream(client, "r" * 16, read_interval_s=0.05, read_block_ms=200, entry_max_bytes=4096)
    try:
        await reader.start()
        t0 = time.monotonic()
        keys = [i.to_bytes(16, "big") for i in range(60)]
        for k in keys:
            writer.emit(BlocksRecorded("r1", (k,)))
            await writer.flush()
            await asyncio.sleep(0.002)
        index = reader._index
        await wait_for(lambda: all(index.match("r1", [k]) == 1 for k in keys), what="all 60 chains applied")
        elapsed = time.monotonic() - t0
        assert reader.reads <= elapsed / 0.05 + 3, (reader.reads, elapsed)
        assert reader.rejected == 0
    finally:
        await reader.stop()
        await client.aclose()


async def test_an_idle_reader_does_not_time_out(tmp_path: Path, redis_server, caplog) -> None:
    """The gateway's reader blocks for less than ``command_timeout_s`` (0.5 s): idle for 1.5 s it
    logs no read failure (it used to block lease_ttl_s / 4 = 2.5 s, time out at 0.5 s, drop its
    connection and sleep 1 s, so the first entry after an idle spell waited up to 1.5 s)."""
    caplog.set_level(logging.WARNING, logger="prefixgate.state")
    async with shared_instances(tmp_path, 2, redis_server.url) as (a, b):
        await asyncio.sleep(1.5)  # idle on purpose: the condition under test is "nothing happens"
        assert not [r for r in caplog.records if "routing stream read failed" in r.getMessage()]
        # an observation, not a load delta: the 1.5 s sleep ends on a lease tick, whose load snapshot
        # (local load: 0) could follow a made-up delta in the same entry and replace it (session 8)
        seen: list[Observed] = []
        b.shared.routing.on_observed = seen.append
        a.shared.routing.emit(Observed("p", "r0", 7, 7, 0, None))
        await wait_for(lambda: seen == [Observed("p", "r0", 7, 7, 0, None)], what="an entry after an idle spell")


async def test_an_entry_naming_this_instance_is_never_applied(redis_server) -> None:
    """Skipped before its MAC is checked: a well-MAC'd entry of ours and a forged one claiming our id
    both change nothing; another instance's entry is applied."""
    client = aioredis.Redis.from_url(redis_server.url)
    me = _stream(client, "m" * 16)
    body = encode_events([LoadDelta("r0", 5, 0, 1)])
    try:
        st = stamp(1, int(time.time() * 1000)).encode()  # R13-2: every entry carries its writer's stamp
        assert me.apply_entry({b"i": me.instance_id.encode(), b"n": st, b"b": body,
                               b"m": me._mac(me.instance_id, st.decode(), body).encode()}) == 0
        assert me.apply_entry({b"i": me.instance_id.encode(), b"n": st, b"b": body, b"m": b"00" * 32}) == 0
        assert me.remote.total("r0") == (0, 0, 0) and me.remote.instances() == set()
        other = "o" * 16
        assert me.apply_entry({b"i": other.encode(), b"n": st, b"b": body, b"m": b"00" * 32}) == 0
        assert me.rejected == 1
        assert me.apply_entry({b"i": other.encode(), b"n": st, b"b": body,
                               b"m": me._mac(other, st.decode(), body).encode()}) == 1
        assert me.remote.total("r0") == (5, 0, 1)
    finally:
        await client.aclose()


def test_mac_and_body_are_what_earlier_instances_wrote_and_read() -> None:
    """The body (orjson now) is the compact JSON ``json.dumps`` wrote; the MAC is HMAC-SHA256 over
    the prefix, the id, the stamp and the body (session 13, R13-2: the stamp is new, so an entry
    of a writer before session 13 is refused: a rolling upgrade shares routing state once done)."""
    loads = SharedLoadTracker(InProcessLoadTracker(), RemoteLoadView(), lambda e: None)
    s = RoutingStream(None, "pgs6:", "a" * 16, KEY, InProcessPrefixIndex(10), loads, REPLICAS, lease_ttl_s=10)
    events = [BlocksRecorded("r0", (b"\x01" * 16, b"\xff" * 16)), LoadDelta("r1", 3, -2, 1),
              LoadSnapshot({"r0": (1, 2, 3), "r1": (0, 0, 0)})]
    body = encode_events(events)
    old = json.dumps([["b", "r0", ["01" * 16, "ff" * 16]], ["d", "r1", 3, -2, 1],
                      ["s", {"r0": [1, 2, 3], "r1": [0, 0, 0]}]], separators=(",", ":")).encode()
    assert body == old
    assert decode_events(old) == events
    msg = length_prefixed("pgs6:") + length_prefixed("a" * 16) + length_prefixed("7:1000") + body
    assert s._mac("a" * 16, "7:1000", body) == hmac.new(KEY, msg, hashlib.sha256).hexdigest()
    with pytest.raises(ValueError):
        decode_events(b"\xff not json")
