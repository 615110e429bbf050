"""Issue 16 / session 8: with the limits' script batcher, the routing stream's ``XADD`` and a busy
reader's ``XREAD`` ride its batches (no round trip of their own under load), and nothing else changes:
every event still arrives in order and MAC-checked, an idle reader still blocks on its own connection
and sees the first entry after an idle spell, and a failed batched read does not stop the reader.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from gateway.shared_routing import RoutingStream
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.shared import BlocksRecorded, LoadDelta, RemoteLoadView, SharedLoadTracker
from tenancy.shared_batch import BatchedScript, ScriptBatcher
from tests.support.waiting import wait_for

KEY = bytes(range(32))
REPLICAS = ["r0", "r1"]


def _stream(client: aioredis.Redis, instance: str, batcher: ScriptBatcher | None, **kw: object) -> RoutingStream:
    loads = SharedLoadTracker(InProcessLoadTracker(), RemoteLoadView(), lambda e: None)
    return RoutingStream(client, "pgs8:", instance, KEY, InProcessPrefixIndex(1000), loads, REPLICAS,
                         lease_ttl_s=10, batcher=batcher, **kw)


async def test_xadd_and_busy_xread_ride_the_script_batches_and_every_event_arrives(redis_server) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    wb, rb = ScriptBatcher(client), ScriptBatcher(client)
    writer = _stream(client, "w" * 16, wb, write_interval_s=0)
    reader = _stream(client, "r" * 16, rb, read_interval_s=0.005, read_block_ms=200)
    script = BatchedScript(rb, client.register_script("return ARGV[1]"))
    try:
        await writer.tick()  # its alive key: the reader's lease check keeps its load
        await reader.start()
        keys = [i.to_bytes(16, "big") for i in range(40)]
        for i, k in enumerate(keys):
            writer.emit(BlocksRecorded("r1", (k,)))
            writer.emit(LoadDelta("r0", i, 0, 1))
            await writer.flush()
            assert await script(args=[str(i)]) == str(i).encode()  # the request path's calls still answer
            await asyncio.sleep(0.002)
        index = reader._index
        await wait_for(lambda: all(index.match("r1", [k]) == 1 for k in keys), what="all 40 chains applied")
        await wait_for(lambda: reader.remote.total("r0") == (sum(range(40)), 0, 40), what="every delta applied")
        assert writer.writes >= 40 and wb.calls >= 40  # each XADD went through the writer's batcher
        assert rb.calls > 40  # the script calls and the reads that followed a read with entries
        assert reader.rejected == 0
    finally:
        await reader.stop()
        await wb.aclose()
        await rb.aclose()
        await client.aclose()


async def test_a_failed_batched_read_falls_back_to_the_blocking_read(redis_server) -> None:
    client = aioredis.Redis.from_url(redis_server.url)
    writer = _stream(client, "w" * 16, None, write_interval_s=0)

    class Broken:
        calls = 0

        async def command(self, *args: object) -> object:
            Broken.calls += 1
            raise ConnectionError("batch failed")

    reader = _stream(client, "r" * 16, Broken(), read_interval_s=0, read_block_ms=200)  # type: ignore[arg-type]
    try:
        await writer.tick()  # its alive key: the reader's lease check keeps its load
        await writer.flush()
        await reader.start()
        writer.emit(LoadDelta("r0", 3, 0, 1))
        await writer.flush()
        await wait_for(lambda: reader.remote.total("r0") == (3, 0, 1), what="first delta (blocking read)")
        await wait_for(lambda: Broken.calls >= 1, what="a batched read tried after entries were found")
        writer.emit(LoadDelta("r0", 4, 0, 1))
        await writer.flush()
        # the reader logged the failure, slept and went back to its own blocking XREAD
        await wait_for(lambda: reader.remote.total("r0") == (7, 0, 2), what="next delta after the failure")
    finally:
        await reader.stop()
        await client.aclose()


async def test_a_reader_behind_catches_up_in_small_batched_reads(redis_server) -> None:
    """A batched XREAD takes at most 16 entries (its reply precedes the script replies batched after
    it); a reader 60 entries behind catches up in several reads, every entry applied in order."""
    client = aioredis.Redis.from_url(redis_server.url)
    rb = ScriptBatcher(client)
    writer = _stream(client, "w" * 16, None, write_interval_s=0)
    reader = _stream(client, "r" * 16, rb, read_interval_s=0.3, read_block_ms=200)
    try:
        await writer.tick()
        await writer.flush()
        await reader.start()
        writer.emit(LoadDelta("r0", 1, 0, 1))
        await writer.flush()
        await wait_for(lambda: reader.remote.total("r0") == (1, 0, 1), what="first entry (blocking read)")
        reads_before = reader.reads
        for i in range(60):  # while the reader waits its read interval: it falls 60 entries behind
            writer.emit(LoadDelta("r0", 0, i, 0))
            await writer.flush()
        await wait_for(lambda: reader.remote.total("r0") == (1, sum(range(60)), 1), what="all 60 entries applied")
        assert reader.reads - reads_before >= 4  # 60 entries, at most 16 per read
        assert rb.calls >= 4
    finally:
        await reader.stop()
        await rb.aclose()
        await client.aclose()
