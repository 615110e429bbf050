"""gateway/flow.py without HTTP: room per instance, prefill-token bound, engine metrics, locality, fairness."""

from __future__ import annotations

import asyncio

import pytest

from gateway.flow import FlowControl, NotifyingLoadTracker
from gateway.config_flow import FlowConfig
from gateway.metrics import GatewayMetrics
from gateway.replicas import Replica, ReplicaSet
from routing.calibration import Calibration, EngineSample
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.policies import RouteRequest
from routing.router import Router
from routing.config import policy_from_config
from routing.policies import CacheAwareConfig
from tenancy.registry import Tenant
from tenancy.tiers import TierWeights


def make(cfg: FlowConfig, n: int = 1, calibration: Calibration | None = None,
         weights: dict[str, float] | None = None) -> FlowControl:
    loads = NotifyingLoadTracker(InProcessLoadTracker())
    router = Router(policy_from_config(CacheAwareConfig()), InProcessPrefixIndex(1000), loads, 16, calibration)
    rs = ReplicaSet([Replica(f"r{i}", f"http://127.0.0.1:{9 + i}", "default", {}, True) for i in range(n)],
                    failure_threshold=3, cooldown_s=5)
    flow = FlowControl(cfg, router, rs, GatewayMetrics(), TierWeights(weights or {}), calibration)
    loads.on_release = flow.on_load_released
    return flow


def req(tenant: str = "a", prompt: int = 100, keys: tuple[bytes, ...] = ()) -> RouteRequest:
    return RouteRequest(tenant_id=tenant, block_keys=list(keys), prompt_tokens=prompt, max_tokens=8,
                        block_size=16, sequences=1)


async def started(flow: FlowControl, tenant: Tenant, r: RouteRequest, ids: list[str]) -> asyncio.Task:
    task = asyncio.ensure_future(flow.release(tenant, r, ids, (), deadline=10**9))
    await asyncio.sleep(0)
    return task


async def test_each_instance_uses_its_share_of_a_replica() -> None:
    flow = make(FlowConfig(replica_max_running_requests=4, instances=2))  # 2 per instance
    a = Tenant("a")
    t = [await started(flow, a, req(), ["r0"]) for _ in range(3)]
    assert [x.done() for x in t] == [True, True, False]
    (await t[0]).ticket.finish()  # room again: the third is released
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert t[2].done()


async def test_prefill_token_bound_and_first_byte_release() -> None:
    flow = make(FlowConfig(replica_max_queued_prefill_tokens=150))
    a = Tenant("a")
    first = await started(flow, a, req(prompt=100), ["r0"])
    second = await started(flow, a, req(prompt=100), ["r0"])
    assert first.done() and not second.done()  # 100 + 100 > 150
    (await first).ticket.first_byte()  # prefill done: its tokens no longer queued
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert second.done()


async def test_engine_waiting_requests_close_the_room() -> None:
    cal = Calibration()
    flow = make(FlowConfig(replica_max_engine_waiting_requests=3), calibration=cal)
    a = Tenant("a")
    first = await started(flow, a, req(), ["r0"])
    assert first.done()
    cal.observe_engine("r0", EngineSample(engine="vllm", running=8, waiting=5))
    second = await started(flow, a, req(), ["r0"])
    assert not second.done()  # the engine says it is queueing: wait at the gateway
    cal.observe_engine("r0", EngineSample(engine="vllm", running=8, waiting=0))
    (await first).ticket.first_byte()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert second.done()


async def test_light_tenant_goes_before_a_heavy_backlog() -> None:
    flow = make(FlowConfig(replica_max_running_requests=1))
    a, b = Tenant("a"), Tenant("b")
    running = await started(flow, a, req("a", 1000), ["r0"])
    heavy = [await started(flow, a, req("a", 1000), ["r0"]) for _ in range(5)]
    light = await started(flow, b, req("b", 10), ["r0"])
    (await running).ticket.finish()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert light.done() and not any(h.done() for h in heavy)
    for h in heavy:
        h.cancel()
    await asyncio.gather(*heavy, return_exceptions=True)
    assert len(flow.queue) == 0


async def test_warm_request_is_not_held_behind_a_cold_one() -> None:
    """r0 is busy and holds b's prefix; r1 has room. a's request (no prefix: warm anywhere)
    goes to r1 although b is fairer, while b waits for r0 within the locality slack."""
    flow = make(FlowConfig(replica_max_running_requests=1, locality_slack_tokens=5000), n=2)
    a, b = Tenant("a"), Tenant("b")
    keys = tuple(bytes([i]) * 8 for i in range(4))
    warmup = await started(flow, b, req("b", 64, keys), ["r0"])
    (await warmup).ticket.finish()
    busy = await started(flow, a, req("a", 10), ["r0"])  # r0 busy now
    r_busy = await busy
    assert r_busy.choice.replica_id == "r0"
    flow.queue.charge("a", 100)  # a is behind b in fairness, within the slack
    # r1 is busy too; then r1 frees while r0 (b's prefix) is still busy
    other = await started(flow, a, req("a", 10), ["r1"])
    r_other = await other
    cold_b = await started(flow, b, req("b", 64, keys), ["r0", "r1"])
    warm_a = await started(flow, a, req("a", 10), ["r0", "r1"])
    assert not cold_b.done() and not warm_a.done()
    r_other.ticket.finish()  # r1 has room: a (warm anywhere) goes; b keeps waiting for r0
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert warm_a.done() and not cold_b.done()
    (await warm_a).ticket.finish()
    r_busy.ticket.finish()  # r0 has room: b goes warm
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    rel = await cold_b
    assert rel.choice.replica_id == "r0" and rel.choice.predicted_prefix_tokens > 0


@pytest.mark.parametrize("wait_s,deadline_in,code", [(0.05, 100.0, 429), (100.0, 0.05, 504)])
async def test_queue_wait_bounds(wait_s: float, deadline_in: float, code: int) -> None:
    import time

    from gateway.errors import GatewayError

    flow = make(FlowConfig(replica_max_running_requests=1, tenant_max_queue_wait_s=wait_s))
    a = Tenant("a")
    first = await started(flow, a, req(), ["r0"])
    with pytest.raises(GatewayError) as exc:
        await flow.release(a, req(), ["r0"], (), deadline=time.perf_counter() + deadline_in)
    assert exc.value.status == code and len(flow.queue) == 0
    (await first).ticket.finish()


async def test_room_that_appears_without_a_load_release_is_noticed() -> None:
    """A replica back to health (no ticket released anywhere): the periodic recheck releases the queue."""
    from tests.support.waiting import wait_for

    flow = make(FlowConfig())
    await flow.start()
    try:
        flow.replica_set.mark_health("r0", False)
        task = await started(flow, Tenant("a"), req(), ["r0"])
        assert not task.done() and len(flow.queue) == 1
        flow.replica_set.mark_health("r0", True)
        await wait_for(task.done, what="released after the replica came back")
        assert (await task).choice.replica_id == "r0"
    finally:
        await flow.stop()


async def test_cold_only_when_recomputing_the_prefix_costs_less_than_waiting() -> None:
    """b's prefix (64 tokens) sits on r0. r0 busy with a small request: b waits for r0 although
    r1 has room. r0 busy with a large one (more tokens in flight than b's prefix): b goes cold."""
    keys = tuple(bytes([i]) * 8 for i in range(4))
    for busy_prompt, expect in ((10, None), (5000, "r1")):
        flow = make(FlowConfig(replica_max_running_requests=1), n=2)
        a, b = Tenant("a"), Tenant("b")
        (await (await started(flow, b, req("b", 64, keys), ["r0"]))).ticket.finish()
        r_busy = await (await started(flow, a, req("a", busy_prompt), ["r0"]))
        task = await started(flow, b, req("b", 64, keys), ["r0", "r1"])
        if expect is None:
            assert not task.done()  # waits for its warm replica
            r_busy.ticket.finish()
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            assert (await task).choice.replica_id == "r0"
        else:
            assert task.done() and (await task).choice.replica_id == expect
            r_busy.ticket.finish()
