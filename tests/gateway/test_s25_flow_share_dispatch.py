"""Flow control with the share rule (S25-newcomer-1): tenant A floods every replica's prefill room while
tenant B is active; B's request is dispatched at once, behind at most A's share of the room. Before the
rule A filled the room and B waited at the gateway (then behind A's whole room). No HTTP, no sleeps:
``asyncio.sleep(0)`` only yields to the dispatcher; the activity clock is a fake."""

from __future__ import annotations

import asyncio

from gateway.config_flow import FlowConfig
from gateway.flow import FlowControl, NotifyingLoadTracker
from gateway.flow_waiting import Release
from gateway.metrics import GatewayMetrics
from gateway.replicas import Replica, ReplicaSet
from routing.config import policy_from_config
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.policies import CacheAwareConfig, RouteRequest
from routing.router import Router
from tenancy.registry import Tenant
from tenancy.tiers import TierWeights

ROOM = 1000  # flow.replica_max_queued_prefill_tokens
LONG = 500  # A's prompts: two fill a replica's room
IDS = ["r0", "r1"]


class Clock:
    now = 1000.0

    def __call__(self) -> float:
        return self.now


def make(idle_s: float | None = 5.0, weights: dict[str, float] | None = None) -> tuple[FlowControl, Clock]:
    loads = NotifyingLoadTracker(InProcessLoadTracker())
    router = Router(policy_from_config(CacheAwareConfig()), InProcessPrefixIndex(1000), loads, 16)
    rs = ReplicaSet([Replica(i, f"http://127.0.0.1:{9 + n}", "default", {}, True) for n, i in enumerate(IDS)],
                    failure_threshold=3, cooldown_s=5)
    cfg = FlowConfig(replica_max_queued_prefill_tokens=ROOM, tenant_share_idle_s=idle_s)
    flow = FlowControl(cfg, router, rs, GatewayMetrics(), TierWeights(weights or {}))
    loads.on_release = flow.on_load_released
    clock = Clock()
    if flow.shares is not None:
        flow.shares.clock = clock
    return flow, clock


def req(tenant: str, prompt: int) -> RouteRequest:
    return RouteRequest(tenant_id=tenant, block_keys=[], prompt_tokens=prompt, max_tokens=8, block_size=16,
                        sequences=1)


async def send(flow: FlowControl, tenant: Tenant, prompt: int) -> asyncio.Task[Release]:
    task = asyncio.ensure_future(flow.release(tenant, req(tenant.id, prompt), IDS, (), deadline=10**9))
    await asyncio.sleep(0)
    return task


def queued_prefill(flow: FlowControl, rid: str) -> int:
    return flow.router.loads.snapshot(rid).queued_prefill_tokens


async def flood(flow: FlowControl, a: Tenant, n: int = 8) -> list[asyncio.Task[Release]]:
    return [await send(flow, a, LONG) for _ in range(n)]


async def drain(tasks: list[asyncio.Task[Release]]) -> None:
    for t in tasks:
        if t.done():
            t.result().ticket.finish()
        else:
            t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def b_was_active(flow: FlowControl, b: Tenant) -> None:
    first = await send(flow, b, 50)
    rel = await first
    rel.ticket.first_byte()
    rel.ticket.finish()


async def test_victim_is_dispatched_at_once_behind_at_most_the_flooders_share() -> None:
    flow, _ = make()
    a, b = Tenant("a"), Tenant("b")
    await b_was_active(flow, b)  # b's last request just ended: b is active for tenant_share_idle_s
    flooding = await flood(flow, a)
    ahead = {rid: queued_prefill(flow, rid) for rid in IDS}
    victim = await send(flow, b, 50)
    assert victim.done(), "b's request waited at the gateway: a holds the whole room"
    rel = await victim
    share_a = ROOM * 1 / 2
    assert ahead[rel.choice.replica_id] <= share_a
    rel.ticket.finish()
    await drain(flooding)


async def test_a_tenant_alone_uses_the_whole_room() -> None:
    flow, _ = make()
    a = Tenant("a")
    flooding = await flood(flow, a)
    assert [queued_prefill(flow, rid) for rid in IDS] == [ROOM, ROOM]  # work conservation
    await drain(flooding)


async def test_the_cap_lifts_when_the_other_tenant_goes_idle() -> None:
    flow, clock = make(idle_s=5.0)
    a, b = Tenant("a"), Tenant("b")
    await b_was_active(flow, b)
    flooding = await flood(flow, a)
    assert [queued_prefill(flow, rid) for rid in IDS] == [LONG, LONG]  # each at a's share (500 of 1000)
    clock.now += 5.1  # b idle past tenant_share_idle_s
    flooding[0].result().ticket.first_byte()  # any release runs the dispatcher
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert [queued_prefill(flow, rid) for rid in IDS] == [ROOM, ROOM]
    await drain(flooding)


async def test_weights_set_the_share() -> None:
    flow, _ = make(weights={"gold": 3.0})
    a, b = Tenant("a", tier="gold"), Tenant("b")
    await b_was_active(flow, b)
    flooding = await flood(flow, a, 6)
    # a's share is 3/4 of 1000 = 750: one 500-token prompt per replica (a second would make 1000)
    assert [queued_prefill(flow, rid) for rid in IDS] == [LONG, LONG]
    await drain(flooding)
    flow, _ = make(weights={"gold": 3.0})
    await b_was_active(flow, Tenant("b"))
    small = [await send(flow, a, 250) for _ in range(8)]
    assert [queued_prefill(flow, rid) for rid in IDS] == [750, 750]  # three of 250 each
    await drain(small)


async def test_rule_off_keeps_the_old_behaviour() -> None:
    flow, _ = make(idle_s=None)
    a, b = Tenant("a"), Tenant("b")
    assert flow.shares is None
    await b_was_active(flow, b)
    flooding = await flood(flow, a)
    victim = await send(flow, b, 50)
    assert not victim.done() and [queued_prefill(flow, rid) for rid in IDS] == [ROOM, ROOM]
    victim.cancel()
    await asyncio.gather(victim, return_exceptions=True)
    await drain(flooding)
