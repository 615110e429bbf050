"""Issue 14 (session 8): flow control's synchronous fast path (:meth:`FlowControl.release_now`), which
the pipeline tries before the awaited :meth:`FlowControl.release`, releases exactly what ``release``
would (the same replica, load, index entries and tenant counter) and declines (None, nothing changed)
whenever ``release`` would have queued the request; ``release(tried=True)`` then queues it."""

from __future__ import annotations

import asyncio

from gateway.config_flow import FlowConfig
from tenancy.registry import Tenant
from tests.gateway.test_s2_flow_dispatch import make, req


async def test_release_now_releases_what_release_would() -> None:
    a = Tenant("a")
    fast, slow = make(FlowConfig(), n=3), make(FlowConfig(), n=3)
    for i in range(12):
        r = req(prompt=40 + 16 * (i % 4), keys=tuple(b"k%d" % j for j in range(i % 4)))
        got = fast.release_now(a, r, ["r0", "r1", "r2"], ())
        want = await slow.release(a, r, ["r0", "r1", "r2"], (), deadline=10**9)
        assert got is not None
        assert (got.choice, got.virtual_tokens) == (want.choice, want.virtual_tokens)
        assert [fast.router.loads.snapshot(f"r{k}") for k in range(3)] == \
            [slow.router.loads.snapshot(f"r{k}") for k in range(3)]
        if i % 3 == 0:
            got.ticket.finish()
            want.ticket.finish()
    assert fast.router.index.stats() == slow.router.index.stats()
    assert fast.queue.counter("a") == slow.queue.counter("a")


async def test_release_now_declines_without_a_change_and_release_tried_queues() -> None:
    flow = make(FlowConfig(replica_max_running_requests=1))
    a, b = Tenant("a"), Tenant("b")
    first = flow.release_now(a, req(prompt=100), ["r0"], ())
    assert first is not None
    counters = flow.queue.counters()
    assert flow.release_now(b, req(prompt=50), ["r0"], ()) is None  # the replica is full
    assert flow.queue.counters() == counters and len(flow.queue) == 0  # nothing charged, nothing queued
    task = asyncio.ensure_future(flow.release(b, req(prompt=50), ["r0"], (), deadline=10**9, tried=True))
    await asyncio.sleep(0)
    assert flow.tenant_queued("b") == 1 and not task.done()
    assert flow.release_now(a, req(prompt=10), ["r0"], ()) is None  # something waits: never past it
    first.ticket.finish()
    assert (await asyncio.wait_for(task, 5)).choice.replica_id == "r0"
