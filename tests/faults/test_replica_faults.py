"""Replica faults: refused connections, 5xx, stalls, resets, invalid JSON, broken SSE, death
under load, restarts. Upstream timeouts are 0.5 s (first byte, read), 2 s total, 2 attempts;
health checks every 0.1 s; the breaker opens after 2 failures for 0.5 s (see conftest)."""

from __future__ import annotations

import asyncio
import json
import time

from gateway.replicas import CircuitState
from tests.support.waiting import wait_for
from tests.support.replica_health import stop_health

LONG = " ".join(f"w{i}" for i in range(96))


def body(i: int | str = 0, **kw):
    b = {"model": "sim-model", "prompt": f"p{i} {LONG}", "max_tokens": 4}
    b.update(kw)
    return b


def events(text: str) -> list[str]:
    return [e for e in text.split("\n\n") if e.strip()]


def error_of(event: str) -> dict | None:
    if not event.startswith("data: ") or event == "data: [DONE]":
        return None
    obj = json.loads(event[6:])
    return obj.get("error")


async def stream(stack, workload: str = "tenant-a/app", **kw) -> tuple[int, list[str], float]:
    t0 = time.perf_counter()
    async with stack.client.stream("POST", "/v1/completions", headers=stack.auth(workload),
                                   json=body(stream=True, **kw)) as r:
        text = (await r.aread()).decode()
    return r.status_code, events(text), time.perf_counter() - t0


async def test_refused_connection_retried_only_on_allowed_replica(stack, sim):
    await stop_health(stack)  # so routing still believes r0 is up
    await sim.kill(0)
    for i in range(6):
        r = await stack.client.post("/v1/completions", json=body(i), headers=stack.auth())
        assert r.status_code == 200, r.text
    recs = [x for x in stack.components.audit.records if x["outcome"] == "allowed"]
    assert {x["replica"] for x in recs} == {"r1"}
    assert any(x["attempts"] == 2 for x in recs)  # at least one went to r0 first and was retried
    assert sim.counter("requests", (2,)) == 0  # never retried into the eu pool
    assert stack.components.replica_set.state("r0").consecutive_failures >= 1  # fed the breaker


async def test_all_allowed_replicas_5xx_never_spill_into_other_pool(stack, sim):
    await stop_health(stack)
    await sim.fault(0, status=503)
    await sim.fault(1, status=503)
    r = await stack.client.post("/v1/completions", json=body(), headers=stack.auth())
    assert r.status_code == 502
    assert stack.components.audit.records[-1]["attempts"] == 2  # max_attempts, then the answer
    assert r.json()["error"] == {"message": "the replica failed to answer", "type": "server_error",
                                 "code": "upstream_error", "param": None}
    assert sim.counter("faulted", (0, 1)) == 2  # tried each allowed replica once
    assert sim.counter("requests", (2,)) == 0 and sim.counter("faulted", (2,)) == 0


async def test_stall_before_first_byte_retried_elsewhere_within_bound(stack, sim):
    # a streamed answer's first byte is bounded by first_byte_timeout_s (a stalled prefill)
    await sim.fault(0, stall_before_first_byte_s=5)
    for i in range(4):
        t0 = time.perf_counter()
        r = await stack.client.post("/v1/completions", json=body(i, stream=True), headers=stack.auth())
        assert r.status_code == 200, r.text
        assert time.perf_counter() - t0 < 4.5  # not the 5 s stall: the first-byte timeout cut it
        assert stack.components.audit.records[-1]["attempts"] <= 2
    # the stalled upstream calls were abandoned (cancelled on the replica), not left running
    assert await _until(lambda: sim.counter("cancellations", (0,)) == sim.counter("requests", (0,)))


async def test_all_allowed_stalled_gives_504_in_bounded_time(stack, sim):
    await sim.fault(0, stall_before_first_byte_s=5)
    await sim.fault(1, stall_before_first_byte_s=5)
    t0 = time.perf_counter()
    r = await stack.client.post("/v1/completions", json=body(stream=True), headers=stack.auth())
    elapsed = time.perf_counter() - t0
    assert r.status_code == 504
    assert r.json()["error"] == {"message": "the replica did not answer in time", "type": "server_error",
                                 "code": "upstream_timeout", "param": None}
    assert elapsed < 4.5  # bounded by the timeouts (2 attempts x 0.5 s), not by the 5 s stall
    assert stack.components.audit.records[-1]["attempts"] == 2
    assert sim.counter("requests", (2,)) == 0


async def test_plain_answer_slower_than_first_byte_timeout_is_served_once(stack, sim):
    # review finding: a plain answer's first byte comes only after the whole generation; cutting it at
    # first_byte_timeout_s opened healthy replicas' breakers for in-quota requests and ran them twice
    for i in range(3):
        await sim.fault(i, stall_before_first_byte_s=1.0)  # > first_byte_timeout_s 0.5, < total 2.0
    r = await stack.client.post("/v1/completions", json=body(), headers=stack.auth())
    assert r.status_code == 200, r.text
    assert stack.components.audit.records[-1]["attempts"] == 1
    assert sum(sim.counter("requests", (i,)) for i in range(3)) == 1
    rs = stack.components.replica_set
    assert all(rs.state(f"r{i}").consecutive_failures == 0 and rs.state(f"r{i}").circuit is CircuitState.CLOSED
               for i in range(3))


async def test_mid_stream_stall_ends_with_error_event_no_retry(stack, sim):
    for i in range(3):
        await sim.fault(i, stall_mid_stream_s=5)
    status, evs, elapsed = await stream(stack, max_tokens=40)
    assert status == 200 and elapsed < 4.5  # the read timeout, not the 5 s stall
    assert "data: [DONE]" not in evs
    assert error_of(evs[0]) is None  # the first token got through ...
    assert error_of(evs[-1]) == {"message": "the replica stream failed before completion", "type": "server_error",
                                 "code": "upstream_timeout", "param": None}  # ... then a clean error, not silence
    assert sim.counter("requests") == 1  # after the first byte: never retried
    rec = stack.components.audit.records[-1]
    assert rec["error_code"] == "upstream_timeout" and rec["outcome"] == "failed"


async def test_reset_mid_stream_ends_with_error_event(stack, sim):
    for i in range(3):
        await sim.fault(i, reset_mid_stream=True)
    status, evs, _ = await stream(stack, max_tokens=40)
    assert status == 200 and "data: [DONE]" not in evs
    assert error_of(evs[-1])["code"] == "upstream_stream_error"
    assert sim.counter("requests") == 1
    rid = stack.components.audit.records[-1]["replica"]
    # counted: against the (replica, tenant) pair, one tenant alone (R8-2: not the shared circuit)
    assert stack.components.replica_set.tenants.streak(rid, "tenant-a") >= 1


async def test_reset_before_first_byte_non_stream_is_retried(stack, sim):
    await stop_health(stack)
    await sim.fault(0, reset_mid_stream=True)  # non-streaming: the replica resets before answering
    for i in range(3):
        r = await stack.client.post("/v1/completions", json=body(i), headers=stack.auth())
        assert r.status_code == 200, r.text
    assert sim.counter("requests", (2,)) == 0


async def test_invalid_json_stream_and_plain(stack, sim, audit_hub):
    for i in range(3):
        await sim.fault(i, invalid_json=True)
    status, evs, _ = await stream(stack)
    assert status == 200
    assert [error_of(e)["code"] for e in evs] == ["upstream_stream_error"]  # nothing broken was forwarded
    r = await stack.client.post("/v1/completions", json=body(1), headers=stack.auth())
    assert r.status_code == 502
    assert r.json()["error"] == {"message": "the replica sent an invalid answer", "type": "server_error",
                                 "code": "upstream_error", "param": None}
    assert "cmpl-broken" not in r.text
    # R9b-1: the 502 names its audit event like every other answer (R4-5)
    rid = r.headers.get("x-request-id")
    assert rid and [x["status"] for x in audit_hub.records if x["request_id"] == rid] == [502]


async def test_broken_sse_ends_with_error_event(stack, sim):
    for i in range(3):
        await sim.fault(i, broken_sse=True)
    status, evs, _ = await stream(stack)
    assert status == 200
    assert error_of(evs[-1])["code"] == "upstream_stream_error"
    assert not any("not server-sent events" in e for e in evs)


async def test_slow_replica_bounded_by_read_timeout(stack, sim):
    for i in range(3):
        await sim.fault(i, slow_factor=1000)  # 0.2 s per token: 40 tokens would take 8 s
    status, evs, elapsed = await stream(stack, max_tokens=40)
    assert elapsed < 6.0  # not the 8 s of tokens: either no first byte in time, or a stalled stream
    if status == 200:
        assert error_of(evs[-1])["code"] == "upstream_timeout"
    else:
        assert status == 504 and json.loads(evs[0])["error"]["code"] == "upstream_timeout"


async def test_breaker_opens_then_half_open_probe_closes_it(stack, sim):
    rs = stack.components.replica_set
    reg = "tenant-reg/app"  # only r2 (pool eu) may serve it
    await sim.fault(2, stall_before_first_byte_s=5)  # /health stays fine: only the breaker can react
    # R8-2: the shared circuit opens on failures of two tenants; no second tenant may use pool eu here,
    # so a second tenant's failure is given through the breaker's API
    rs.attempt("r2", "tenant-x").failed()
    for i in range(2):
        r = await stack.client.post("/v1/completions", json=body(i), headers=stack.auth(reg))
        assert r.status_code == 504
    # S9-L4: tenants' evidence opens the shared circuit once the gateway's own request timed out there too
    assert await _until(lambda: rs.state("r2").circuit is CircuitState.OPEN)
    assert rs.state("r2").healthy
    sent = sim.counter("requests", (2,))
    r = await stack.client.post("/v1/completions", json=body(9), headers=stack.auth(reg))
    assert r.status_code in (403, 503)  # exact status: test_tenant_pool_down_is_503_not_403
    assert sim.counter("requests", (2,)) == sent and stack.components.audit.records[-1]["attempts"] == 0
    await sim.fault(2)  # the replica recovers
    await asyncio.sleep(0.6)  # cool-down 0.5 s: the next request is the half-open probe
    r = await stack.client.post("/v1/completions", json=body(10), headers=stack.auth(reg))
    assert r.status_code == 200, r.text
    assert rs.state("r2").circuit is CircuitState.CLOSED


async def test_health_checks_take_replica_out_and_back(stack, sim):
    rs = stack.components.replica_set
    reg = "tenant-reg/app"
    await sim.fault(2, status=503)
    assert await _until(lambda: "r2" not in rs.routable_ids())
    r = await stack.client.post("/v1/completions", json=body(), headers=stack.auth(reg))
    assert r.status_code in (403, 503) and stack.components.audit.records[-1]["attempts"] == 0
    assert sim.counter("faulted", (2,)) == 0  # never sent to the down replica
    await sim.fault(2)
    assert await _until(lambda: "r2" in rs.routable_ids())
    r = await stack.client.post("/v1/completions", json=body(), headers=stack.auth(reg))
    assert r.status_code == 200


async def test_tenant_pool_down_is_503_not_403(stack, sim):
    # availability, not permission: r0/r1 are up but tenant-reg's only replica r2 is down
    await sim.fault(2, status=503)
    assert await _until(lambda: "r2" not in stack.components.replica_set.routable_ids())
    r = await stack.client.post("/v1/completions", json=body(), headers=stack.auth("tenant-reg/app"))
    assert r.status_code == 503
    assert r.json()["error"]["code"] == "no_replica"
    assert stack.components.audit.records[-1]["outcome"] == "failed"  # not a "denied" in the audit trail


async def test_restart_on_same_port_forgets_prefix_index(stack, sim):
    idx = stack.components.index
    reg = "tenant-reg/app"
    r = await stack.client.post("/v1/completions", json=body(1), headers=stack.auth(reg))
    assert r.status_code == 200
    assert idx.replica_blocks("r2") > 0
    await sim.kill(2)
    await sim.revive(2)  # a new process: new instance id, empty KV cache
    assert await _until(lambda: idx.replica_blocks("r2") == 0)
    r = await stack.client.post("/v1/completions", json=body(1), headers=stack.auth(reg))
    assert r.status_code == 200
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_sim_restart_changes_instance_and_drops_index(stack, sim):
    idx = stack.components.index
    reg = "tenant-reg/app"
    await stack.client.post("/v1/completions", json=body(2), headers=stack.auth(reg))
    before = idx.replica_blocks("r2")
    assert before > 0
    old = stack.components.replica_set.state("r2").instance_id
    r = await sim.http.post(stack.cluster.urls[2] + "/sim/restart")
    assert r.json()["instance_id"] != old
    assert await _until(lambda: idx.replica_blocks("r2") == 0)
    assert stack.components.replica_set.state("r2").instance_id == r.json()["instance_id"]


async def test_all_down_fast_503_then_recovery_without_restart(stack, sim):
    for i in range(3):
        await sim.kill(i)
    assert await _until(lambda: not stack.components.replica_set.routable_ids())
    for workload in ("tenant-a/app", "tenant-reg/app"):
        r = await stack.client.post("/v1/completions", json=body(), headers=stack.auth(workload))
        assert r.status_code == 503 and stack.components.audit.records[-1]["attempts"] == 0
        assert r.json()["error"] == {"message": "no healthy replica is available for this tenant", "type": "server_error",
                                     "code": "no_replica", "param": None}
    assert (await stack.client.get("/readyz")).status_code == 503
    for i in range(3):
        await sim.revive(i)
    assert await _until(lambda: len(stack.components.replica_set.routable_ids()) == 3)
    assert (await stack.client.get("/readyz")).status_code == 200
    r = await stack.client.post("/v1/completions", json=body(), headers=stack.auth())
    assert r.status_code == 200


async def test_replica_dies_under_load(stack, sim):
    async def one(i: int) -> tuple[str, int, list[str]]:
        if i % 2:
            r = await stack.client.post("/v1/completions", json=body(i, max_tokens=60), headers=stack.auth())
            return "plain", r.status_code, [r.text]
        async with stack.client.stream("POST", "/v1/completions", headers=stack.auth(),
                                       json=body(i, max_tokens=60, stream=True)) as r:
            return "stream", r.status_code, events((await r.aread()).decode())

    up = stack.components.config.upstream  # read per request: room for 20 queued prefills on 2 cores
    up.first_byte_timeout_s, up.read_timeout_s, up.total_timeout_s = 3.0, 3.0, 6.0
    for i in range(3):
        await sim.fault(i, slow_factor=20)  # ~4 ms per token: each request is in flight ~0.25 s
    tasks = [asyncio.ensure_future(one(i)) for i in range(20)]
    await asyncio.sleep(0.1)
    await sim.kill(0)
    results = await asyncio.wait_for(asyncio.gather(*tasks), timeout=15)
    for kind, status, evs in results:
        assert status in (200, 502, 503, 504), (kind, status, evs)
        if kind == "stream" and status == 200:
            last = evs[-1]
            assert last == "data: [DONE]" or error_of(last) is not None, last  # complete or a clean error
    assert any(s == 200 for _, s, _ in results)  # r1 kept serving
    loads = stack.components.router.loads
    assert await _until(lambda: all(loads.snapshot(r).running_requests == 0 for r in ("r0", "r1", "r2")))
    assert stack.components.limiter.in_flight("tenant-a") == 0
    assert all(x["status"] != 500 for x in stack.components.audit.records)


_until = wait_for
