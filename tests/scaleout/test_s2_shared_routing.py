"""Routing state shared over a Redis Stream (gateway/shared_routing.py, routing/shared.py; issue 16)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from gateway.build import Gateway
from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.shared import (
    BlocksRecorded,
    LoadDelta,
    LoadSnapshot,
    RemoteLoadView,
    SharedLoadTracker,
    apply_event,
)
from routing.types import RouteRequest
from tests.scaleout.s2_instances import PREFIX, REPLICAS, instance, shared_instances, write_secret
from tests.support.waiting import wait_for


def _request(gw: Gateway, n: int) -> RouteRequest:
    tokens = [1000 * n + i for i in range(16 * 8)]  # 8 full blocks, a different prompt per n
    chain = gw.keyring.prefix_chain("tenant-a", tokens, 16).current
    return RouteRequest("tenant-a", chain, len(tokens), 32, 16)


@pytest.fixture
async def pair(tmp_path: Path, redis_server):
    async with shared_instances(tmp_path, 2, redis_server.url) as gws:
        yield gws


def test_pure_application_of_events() -> None:
    """apply_event: chains go to the index, load is held per instance and dropped as a whole."""
    index, remote = InProcessPrefixIndex(100), RemoteLoadView()
    apply_event(index, remote, "i1", BlocksRecorded("r1", (b"a" * 16, b"b" * 16)))
    assert index.match("r1", [b"a" * 16, b"b" * 16, b"c" * 16]) == 2
    apply_event(index, remote, "i1", LoadDelta("r1", 100, 32, 1))
    apply_event(index, remote, "i2", LoadDelta("r1", 10, 8, 1))
    assert remote.total("r1") == (110, 40, 2)
    apply_event(index, remote, "i1", LoadSnapshot({"r1": (0, 32, 1)}))  # absolute: replaces i1's
    assert remote.total("r1") == (10, 40, 2)
    assert remote.retain(["i2"]) == {"i1"} and remote.total("r1") == (10, 8, 1)
    apply_event(index, remote, "i2", LoadDelta("r1", -50, -50, -5))  # never below zero
    assert remote.total("r1") == (0, 0, 0)
    # the tracker's snapshot is local + remote, and its ticket emits the releases
    emitted: list[object] = []
    tracker = SharedLoadTracker(InProcessLoadTracker(), remote, emitted.append)
    apply_event(index, remote, "i2", LoadDelta("r1", 5, 5, 1))
    t = tracker.dispatch("r1", 100, 20, 1)
    assert tracker.snapshot("r1").queued_prefill_tokens == 105 and tracker.snapshot("r1").running_requests == 2
    t.first_byte()
    t.first_byte()
    t.finish()
    t.finish()
    assert emitted == [LoadDelta("r1", 100, 20, 1), LoadDelta("r1", -100, 0, 0), LoadDelta("r1", 0, -20, -1)]


async def test_two_instances_route_a_repeated_prefix_to_the_same_replica(pair) -> None:
    a, b = pair
    chosen = {}
    for n in range(8):
        choice, ticket = a.router.route(_request(a, n), REPLICAS)
        ticket.finish()
        chosen[n] = choice.replica_id
    await a.shared.routing.flush()
    await wait_for(lambda: b.shared.routing.applied >= 8 * 3, what="b applied a's chains and load")
    for n in range(8):
        choice, ticket = b.router.route(_request(b, n), REPLICAS)
        ticket.finish()
        # b knows a's prefixes: the whole prompt is predicted cached on the replica a used
        assert choice.replica_id == chosen[n]
        assert choice.predicted_prefix_tokens == 16 * 8
    assert b.router.counters().predicted_prefix_tokens == 8 * 16 * 8
    assert b.shared.routing.rejected == 0


async def test_load_is_seen_by_the_other_instance_and_released(pair) -> None:
    a, b = pair
    _, ticket = a.router.route(_request(a, 1), REPLICAS)
    rid = ticket.replica_id
    await wait_for(lambda: b.router.loads.snapshot(rid).running_requests == 1, what="b sees a's running request")
    assert b.router.loads.snapshot(rid).queued_prefill_tokens == 16 * 8
    ticket.first_byte()
    await wait_for(lambda: b.router.loads.snapshot(rid).queued_prefill_tokens == 0, what="prefill released")
    assert b.router.loads.snapshot(rid).running_requests == 1
    ticket.finish()
    await wait_for(lambda: b.router.loads.snapshot(rid).running_requests == 0, what="request released")


async def test_a_dead_instance_load_expires_with_its_lease(pair, redis_server) -> None:
    a, b = pair
    tickets = [a.router.route(_request(a, n), REPLICAS)[1] for n in range(3)]
    await wait_for(lambda: sum(b.router.loads.snapshot(r).running_requests for r in REPLICAS) == 3,
                   what="b sees a's load")
    await a.shared.routing.halt()  # a crashes: no release, no lease given up
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        ttl_ms = await raw.pttl(f"{PREFIX}routing:alive:{a.shared.instance_id}")
        assert 0 < ttl_ms <= 2.0 * 1000 / 2  # the lease key outlives its renewal by half state.lease_ttl_s
        assert sum(b.router.loads.snapshot(r).running_requests for r in REPLICAS) == 3  # not dropped at once
        await wait_for(lambda: sum(b.router.loads.snapshot(r).running_requests for r in REPLICAS) == 0,
                       what="a's load expired with its lease")
        assert a.shared.instance_id not in b.shared.routing.remote.instances()
    finally:
        await raw.aclose()
    del tickets


async def test_a_starting_instance_rebuilds_from_the_stream(tmp_path: Path, redis_server, pair) -> None:
    a, _ = pair
    choice, ticket = a.router.route(_request(a, 5), REPLICAS)
    ticket.finish()
    await a.shared.routing.flush()
    late = instance(tmp_path, 7, redis_server.url, tmp_path / "master.key")
    await late.shared.start()
    try:
        assert late.index.match(choice.replica_id, _request(late, 5).block_keys) == 8
    finally:
        await late.shared.stop()


async def test_forged_routing_entries_are_ignored_and_counted(pair, redis_server) -> None:
    _, b = pair
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        body = b'[["d","r0",0,0,50]]'
        await raw.xadd(f"{PREFIX}routing:events", {"i": "intruder", "b": body, "m": "00" * 32})
        await raw.xadd(f"{PREFIX}routing:events", {"i": "intruder", "b": b"not json", "m": "x"})
        await wait_for(lambda: b.shared.routing.rejected == 2, what="forged entries rejected")
        assert b.router.loads.snapshot("r0").running_requests == 0
        assert "intruder" not in b.shared.routing.remote.instances()
        text = (await raw.get(f"{PREFIX}nothing")) or b""
        assert text == b""
    finally:
        await raw.aclose()
    # the lag of applied entries is exported
    from prometheus_client import generate_latest

    assert b"prefixgate_shared_routing_lag_seconds" in generate_latest(b.metrics.admin)
    assert b"prefixgate_shared_routing_rejected_entries_total 2.0" in generate_latest(b.metrics.admin)


async def test_another_master_secret_refuses_to_start(tmp_path: Path, redis_server, pair) -> None:
    other = instance(tmp_path, 9, redis_server.url, write_secret(tmp_path / "other.key"))
    from tenancy.keys import KeyRingError

    with pytest.raises(KeyRingError, match="key-check mismatch"):
        await other.start()
    assert not other.lifecycles.started
    assert os.path.exists(tmp_path / "master.key")


async def test_a_restarted_empty_redis_is_refilled_without_restarting_instances(pair, redis_server) -> None:
    """Redis restarts without persistence: no rollback, key records re-published, routing shared again."""
    a, b = pair
    a.keyring.rotate_tenant("tenant-a")
    await a.shared.keys.publish("tenant-a")
    await wait_for(lambda: b.keyring.key_version("tenant-a") == 2, what="rotation adopted")
    redis_server.stop()
    redis_server.start()  # same port, empty
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        async def republished() -> bool:
            rec = await raw.hget(f"{PREFIX}keys:tenants", "tenant-a")
            return rec is not None and rec.startswith(b"2:0:")

        await wait_for(republished, what="key record re-published into the empty Redis")
        await wait_for(lambda: raw.get(f"{PREFIX}keys:check"), what="key-check value set again")
        assert b.keyring.key_version("tenant-a") == 2  # nothing rolled back
        # routing events flow again once the clients reconnect
        applied = b.shared.routing.applied

        async def shared_again() -> bool:
            _, ticket = a.router.route(_request(a, 42), REPLICAS)
            ticket.finish()
            return b.shared.routing.applied > applied

        await wait_for(shared_again, what="routing events applied after the restart")
    finally:
        await raw.aclose()


async def test_concentration_windows_and_alerts_are_shared(tmp_path: Path, redis_server) -> None:
    """Traffic piled onto one replica by instance a raises the alert on b too (the policy input reads it)."""
    import time

    from audit.concentration import ConcentrationMonitor
    from gateway.auditing import AuditHub

    secret = write_secret(tmp_path / "master.key")
    gws = [instance(tmp_path, i, redis_server.url, secret,
                    audit=AuditHub(None, monitor=ConcentrationMonitor(hold_s=0, min_requests=5,
                                                                      eval_interval_s=0)))  # no staleness
           for i in range(2)]
    a, b = gws
    try:
        for gw in gws:
            await gw.shared.start()
        for _ in range(10):  # as AuditHub.record_request does for an allowed request
            a.audit.monitor.observe("default", "r0", 128, 128, 0, time.monotonic())
        assert any(al["kind"] == "replica_concentration" for al in a.audit.active_alerts())
        await wait_for(lambda: any(al["kind"] == "replica_concentration" and al["replica_id"] == "r0"
                                   for al in b.audit.active_alerts()), what="b raised the shared alert")
        assert b.audit.monitor.stats("default")["requests"] == 10
    finally:
        for gw in gws:
            await gw.shared.stop()
