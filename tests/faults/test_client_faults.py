"""Client faults: a client that hangs up before the first byte, during the stream, or while
waiting for a plain answer. The upstream call is cancelled within a second (the simulator
counts ``cancellations``), router loads and tenant concurrency leases are released, and the
audit record says ``cancelled``."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

LONG = " ".join(f"w{i}" for i in range(96))


@pytest.fixture
def config_overrides(stable_secret: str) -> dict[str, Any]:
    # generous upstream timeouts: only the client's disconnect may end these requests
    return {"tenancy": {"master_secret_file": stable_secret},
            "upstream": {"first_byte_timeout_s": 10, "read_timeout_s": 10, "total_timeout_s": 20}}


def body(**kw: Any) -> dict[str, Any]:
    return {"model": "sim-model", "prompt": LONG, "max_tokens": 40, **kw}


async def _released(stack, sim, until, cancelled_before: int, t_hangup: float) -> None:
    c = stack.components
    # generous limits (a loaded 2-core machine), still far below the 10 s upstream timeouts
    # that would end these requests if the hang-up were not propagated
    assert await until(lambda: sim.counter("cancellations") > cancelled_before, timeout_s=5.0), \
        "upstream request not cancelled within 5 s"
    assert time.perf_counter() - t_hangup < 6.0
    assert await until(lambda: all(c.router.loads.snapshot(r).running_requests == 0 for r in ("r0", "r1", "r2")),
                       timeout_s=5.0)
    assert await until(lambda: c.limiter.in_flight("tenant-a") == 0, timeout_s=5.0)
    assert await until(lambda: any(x["outcome"] == "cancelled" for x in c.audit.records), timeout_s=5.0)
    rec = [x for x in c.audit.records if x["tenant"] == "tenant-a"][-1]
    assert rec["outcome"] == "cancelled" and rec["status"] == 499 and rec["error_code"] == "client_disconnect"
    # a client hang-up is not the replica's fault
    assert all(c.replica_set.state(r).consecutive_failures == 0 for r in ("r0", "r1"))


async def _hang_up_after(stack, seconds: float, **kw: Any) -> float:
    async with httpx.AsyncClient(base_url=stack.url, timeout=seconds) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/completions", json=body(**kw), headers=stack.auth())
    return time.perf_counter()


async def test_disconnect_before_first_byte(stack, sim, until):
    for i in range(3):
        await sim.fault(i, stall_before_first_byte_s=5)
    t = await _hang_up_after(stack, 0.4, stream=True)
    await _released(stack, sim, until, 0, t)


async def test_disconnect_while_waiting_for_plain_answer(stack, sim, until):
    for i in range(3):
        await sim.fault(i, slow_factor=200)  # decoding 40 tokens takes seconds
    t = await _hang_up_after(stack, 0.5)
    await _released(stack, sim, until, 0, t)


async def test_disconnect_during_stream(stack, sim, until):
    for i in range(3):
        await sim.fault(i, stall_mid_stream_s=5)
    async with httpx.AsyncClient(base_url=stack.url, timeout=5) as client:
        async with client.stream("POST", "/v1/completions", headers=stack.auth(), json=body(stream=True)) as r:
            assert r.status_code == 200
            async for _ in r.aiter_bytes():
                break  # first token received: hang up
    t = time.perf_counter()
    await _released(stack, sim, until, 0, t)


async def test_many_disconnects_leave_nothing_behind(stack, sim, until):
    # the replicas hold every answer far longer than the test runs: only a propagated hang-up
    # (or the gateway's 10 s first-byte timeout, which the audit would not call "cancelled")
    # ends an upstream request
    for i in range(3):
        await sim.fault(i, stall_before_first_byte_s=60)

    async def one(i: int) -> None:
        # no client timeout: the hang-up below is the test's, not a loaded machine's connect delay
        async with httpx.AsyncClient(base_url=stack.url, timeout=30) as client:
            await client.post("/v1/completions", json=body(prompt=f"c{i} {LONG}", stream=bool(i % 2)),
                              headers=stack.auth())

    before = sim.counter("requests")
    clients = [asyncio.ensure_future(one(i)) for i in range(10)]
    # hang up only once all ten are waiting on a replica (not after a fixed client timeout)
    await until(lambda: sim.counter("requests") - before >= 10, timeout_s=8.0, what="10 requests upstream")
    assert not any(t.done() for t in clients), [t for t in clients if t.done()]
    for t in clients:
        t.cancel()  # the client closes its connection: a hang-up while waiting for the first byte
    await asyncio.gather(*clients, return_exceptions=True)
    t_hangup = time.perf_counter()
    c = stack.components
    assert await until(lambda: sim.counter("cancellations") >= 10, timeout_s=5.0)
    assert time.perf_counter() - t_hangup < 6.0
    assert await until(lambda: c.limiter.in_flight("tenant-a") == 0, timeout_s=5.0)
    assert await until(lambda: all(c.router.loads.snapshot(r).running_requests == 0 for r in ("r0", "r1", "r2")),
                       timeout_s=5.0)
    assert await until(lambda: sum(x["outcome"] == "cancelled" for x in c.audit.records) == 10, timeout_s=5.0)
    assert all(x["outcome"] == "cancelled" for x in c.audit.records), [x["outcome"] for x in c.audit.records]
    # the gateway still serves normally afterwards
    for i in range(3):
        await sim.fault(i)
    r = await stack.client.post("/v1/completions", json=body(max_tokens=4), headers=stack.auth())
    assert r.status_code == 200
