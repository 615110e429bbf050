"""Flow control's fast path (issue 14): a request that can go at once while nothing is queued is
released without the queue machinery, leaving exactly the counters the queued path leaves."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.config_flow import FlowConfig
from routing.fairness import FairQueue
from tenancy.registry import Tenant
from tests.gateway.test_s2_flow_dispatch import make, req


def _spy_push(flow) -> list[str]:
    calls: list[str] = []
    orig = flow.queue.push

    def push(tenant_id, item, weight=1.0):
        calls.append(tenant_id)
        orig(tenant_id, item, weight)

    flow.queue.push = push  # type: ignore[method-assign]
    return calls


async def test_released_at_once_without_queueing_when_nothing_waits() -> None:
    flow = make(FlowConfig(replica_max_running_requests=1))
    pushed = _spy_push(flow)
    a = Tenant("a")
    rel = await flow.release(a, req(prompt=100), ["r0"], (), deadline=10**9)
    assert rel.choice.replica_id == "r0" and rel.queue_wait_s >= 0
    assert pushed == []  # the fast path
    assert flow.queue.counter("a") == 100.0  # uncached prompt tokens charged at release
    # the replica is full now: the next request waits in the queue (the slow path)
    task = asyncio.ensure_future(flow.release(a, req(prompt=50), ["r0"], (), deadline=10**9))
    await asyncio.sleep(0)
    assert pushed == ["a"] and not task.done()
    rel.ticket.finish()
    assert (await asyncio.wait_for(task, 5)).choice.replica_id == "r0"
    assert flow.queue.counter("a") == 150.0


async def test_fast_path_refuses_like_the_queue_when_no_candidate_is_routable() -> None:
    flow = make(FlowConfig(tenant_max_queue_wait_s=0.05))
    a = Tenant("a")
    try:
        await flow.release(a, req(), ["gone"], (), deadline=10**9)
    except Exception as exc:  # waited in the queue, then refused
        assert getattr(exc, "code", None) == "queue_timeout"
    else:
        raise AssertionError("released to a replica that is not a candidate")
    assert len(flow.queue) == 0


async def test_fast_path_keeps_the_lift_of_a_returning_tenant() -> None:
    """B was idle while A was served: B is lifted to the floor A left, as a push would lift it."""
    flow = make(FlowConfig())
    a, b = Tenant("a"), Tenant("b")
    for _ in range(3):
        (await flow.release(a, req("a", prompt=100), ["r0"], (), deadline=10**9)).ticket.finish()
    (await flow.release(b, req("b", prompt=10), ["r0"], (), deadline=10**9)).ticket.finish()
    assert flow.queue.counter("b") == 200.0 + 10.0  # lifted to A's counter before its charge
    assert flow.queue.counter("a") == 300.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.sampled_from([0.5, 1.0, 2.0]),
                          st.integers(0, 500), st.integers(0, 50)), max_size=12))
def test_pass_through_equals_push_select_remove_on_an_empty_queue(ops) -> None:
    slow: FairQueue[object] = FairQueue()
    fast: FairQueue[object] = FairQueue()
    for tid, weight, charged, output in ops:
        item = object()
        slow.push(tid, item, weight)
        sel = slow.select(lambda _: "warm")
        assert sel is not None and sel.item is item
        slow.remove(tid, item)
        slow.charge(tid, charged)
        fast.pass_through(tid, weight)
        fast.charge(tid, charged)
        assert fast.counters() == slow.counters()
        slow.charge(tid, output)
        fast.charge(tid, output)
    assert fast.counters() == slow.counters() and len(fast) == len(slow) == 0
