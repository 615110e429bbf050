"""Issue 12, finding 7: every way the circuit breaker's half-open probe ends settles it.

The public report: the breaker opens after 3x 500; after the cool-down the
next request is over-long and the replica answers 400; from then on every
request got 503 ``no_replica`` because the probe flag was never released on
that path. Here the regulated tenant's only replica (r2) is opened by 3x 500,
the cool-down passes, and the probe request ends in one of every possible
ways against a real (simulated) replica. Afterwards the probe is no longer in
flight, the router's load ticket is back to zero, and the breaker holds the
verdict that ending deserves (docs/routing.md, "Circuit breaker"):

* ``success`` — a complete answer, or an answer that is not a gateway failure (the client's
  4xx, 429, and since R7-2 a plain 500; as Envoy's ``consecutive_gateway_failure``): circuit closed;
* ``failure`` — 502/503/504, first-byte timeout, refused connection, reset, broken
  or invalid answer: re-opened (then it recovers after the cool-down);
* ``first_byte`` — since R7-2 the probe's circuit verdict comes at the first byte of its 200
  answer: closed then, whatever happens to the stream afterwards (a stream cut later counts one
  failure on the closed circuit; a client that leaves gives no further verdict);
* ``none`` — the client left, the task was cancelled, the gateway failed, before the first byte:
  the probe is released and the next request probes.

The circuit is opened with 503s (since R7-2 a 500 no longer counts against a replica).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from gateway.replicas import CircuitState
from tests.support.replica_health import stop_health

sys.path.insert(0, os.path.dirname(__file__))
from i12_asgi import AsgiClient  # noqa: E402

REG = "tenant-reg/app"  # only r2 (pool eu) may serve it: routing is deterministic
LONG = " ".join(f"w{i}" for i in range(96))
THRESHOLD = 3


@pytest.fixture
def config_overrides(stable_secret: str) -> dict[str, Any]:
    return {
        "tenancy": {"master_secret_file": stable_secret},
        "upstream": {"connect_timeout_s": 0.5, "first_byte_timeout_s": 0.5, "read_timeout_s": 0.5,
                     "total_timeout_s": 2.0, "max_attempts": 2},
        # probe timeout: tests/faults/conftest.py (a short one marked replicas down under load)
        "health": {"interval_s": 0.1, "timeout_s": 2.0, "unhealthy_after": 1, "healthy_after": 1,
                   "breaker_failures": THRESHOLD, "breaker_cooldown_s": 0.3},
    }


def body(**kw: Any) -> dict[str, Any]:
    return {"model": "sim-model", "prompt": f"probe {LONG}", "max_tokens": 8, **kw}


async def post(stack: Any, **kw: Any) -> httpx.Response:
    return await stack.client.post("/v1/completions", json=body(**kw), headers=stack.auth(REG))


# ------------------------------------------------------------------ the endings

async def complete_answer(stack: Any, sim: Any, mp: Any) -> None:
    r = await post(stack)
    assert r.status_code == 200, r.text


async def complete_stream(stack: Any, sim: Any, mp: Any) -> None:
    r = await post(stack, stream=True)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text


async def replica_400(stack: Any, sim: Any, mp: Any) -> None:  # the public report's case
    await sim.fault(2, status=400)
    r = await post(stack)
    assert r.status_code == 400 and r.json()["error"]["code"] == "upstream_rejected", r.text


async def replica_429(stack: Any, sim: Any, mp: Any) -> None:
    await sim.fault(2, status=429)
    r = await post(stack)
    assert r.status_code == 502, r.text  # retried elsewhere: there is no elsewhere


async def replica_500(stack: Any, sim: Any, mp: Any) -> None:
    await sim.fault(2, status=500)
    r = await post(stack)
    assert r.status_code == 500, r.text  # R7-2: the request's failure, passed on, not retried


async def first_byte_timeout(stack: Any, sim: Any, mp: Any) -> None:
    await sim.fault(2, stall_before_first_byte_s=3)
    r = await post(stack)
    assert r.status_code == 504, r.text


async def connect_refused(stack: Any, sim: Any, mp: Any) -> None:
    await sim.kill(2)
    r = await post(stack)
    assert r.status_code == 502, r.text


async def reset_before_first_byte(stack: Any, sim: Any, mp: Any) -> None:
    await sim.fault(2, reset_mid_stream=True)
    r = await post(stack)
    assert r.status_code == 502, r.text


async def stream_reset_midway(stack: Any, sim: Any, mp: Any) -> None:
    await sim.fault(2, reset_mid_stream=True)
    r = await post(stack, stream=True)
    assert r.status_code == 200 and "upstream_stream_error" in r.text and "[DONE]" not in r.text


async def invalid_answer(stack: Any, sim: Any, mp: Any) -> None:
    await sim.fault(2, invalid_json=True)
    r = await post(stack)
    assert r.status_code == 502, r.text


async def client_gone_before_answer(stack: Any, sim: Any, mp: Any) -> None:
    await sim.fault(2, stall_before_first_byte_s=3)
    async with httpx.AsyncClient(base_url=stack.url, timeout=0.2) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/completions", json=body(), headers=stack.auth(REG))


async def client_gone_mid_stream(stack: Any, sim: Any, mp: Any) -> None:
    await sim.fault(2, stall_mid_stream_s=3)
    async with httpx.AsyncClient(base_url=stack.url, timeout=5) as client:
        async with client.stream("POST", "/v1/completions", json=body(stream=True), headers=stack.auth(REG)) as r:
            assert r.status_code == 200
            async for _ in r.aiter_bytes():
                break  # first event received: hang up


async def client_gone_as_the_answer_starts(stack: Any, sim: Any, mp: Any) -> None:
    await sim.fault(2, stall_mid_stream_s=3)
    asgi = AsgiClient(stack.components, stack.auth(REG)["Authorization"])
    sent = await asgi.call(body(stream=True), leave="after_upstream", spec="2.3")
    assert not [m for m in sent if m["type"] == "http.response.body" and not m.get("more_body", False)]


async def send_fails_at_response_start(stack: Any, sim: Any, mp: Any) -> None:
    asgi = AsgiClient(stack.components, stack.auth(REG)["Authorization"])
    await asgi.call(body(stream=True), leave="never", spec="2.4", fail_start=True)


async def task_cancelled(stack: Any, sim: Any, mp: Any) -> None:
    await sim.fault(2, stall_before_first_byte_s=3)
    before = sim.counter("requests", (2,))
    asgi = AsgiClient(stack.components, stack.auth(REG)["Authorization"])
    task = asyncio.ensure_future(asgi.call(body(), leave="never"))
    deadline = time.monotonic() + 3
    while sim.counter("requests", (2,)) == before and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    assert sim.counter("requests", (2,)) > before, "the probe never reached the replica"
    task.cancel()  # e.g. the server shutting down
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def gateway_error_after_dispatch(stack: Any, sim: Any, mp: Any) -> None:
    def boom(*args: Any) -> None:  # the trace headers of the upstream call
        raise RuntimeError("a bug between dispatch and the upstream call")

    mp.setattr(stack.components.audit, "inject_trace_headers", boom)
    r = await post(stack)
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    mp.undo()


@dataclass(frozen=True)
class Ending:
    run: Callable[[Any, Any, Any], Awaitable[None]]
    verdict: str  # "success" | "failure" | "first_byte" | "first_byte_then_failure" | "none"


ENDINGS = {
    "complete_answer": Ending(complete_answer, "success"),
    "complete_stream": Ending(complete_stream, "success"),
    "replica_400": Ending(replica_400, "success"),
    "replica_429": Ending(replica_429, "success"),
    "replica_500": Ending(replica_500, "success"),  # R7-2
    "first_byte_timeout": Ending(first_byte_timeout, "failure"),
    "connect_refused": Ending(connect_refused, "failure"),
    "reset_before_first_byte": Ending(reset_before_first_byte, "failure"),
    "stream_reset_midway": Ending(stream_reset_midway, "first_byte_then_failure"),  # R7-2
    "invalid_answer": Ending(invalid_answer, "failure"),
    "client_gone_before_answer": Ending(client_gone_before_answer, "none"),
    "client_gone_mid_stream": Ending(client_gone_mid_stream, "first_byte"),  # R7-2: after the first byte
    "client_gone_as_the_answer_starts": Ending(client_gone_as_the_answer_starts, "first_byte"),
    "send_fails_at_response_start": Ending(send_fails_at_response_start, "first_byte"),
    "task_cancelled": Ending(task_cancelled, "none"),
    "gateway_error_after_dispatch": Ending(gateway_error_after_dispatch, "none"),
}


@pytest.mark.parametrize("name", list(ENDINGS))
async def test_every_ending_of_the_half_open_probe_settles_the_breaker(
    stack: Any, sim: Any, until: Any, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    ending = ENDINGS[name]
    c = stack.components
    rs = c.replica_set
    await stop_health(stack)  # only the breaker reacts (status faults would also fail /health)
    await sim.fault(2, status=503)  # R7-2: a gateway failure (a 500 no longer counts)
    # R8-2: the shared circuit opens (and a failed probe re-opens it) on failures of two tenants; only
    # tenant-reg may use r2, so a second tenant's failure is given through the breaker's API
    rs.attempt("r2", "tenant-x").failed()
    for _ in range(THRESHOLD):
        assert (await post(stack)).status_code == 502
    # S9-L4: tenants' evidence opens the shared circuit once the gateway's own request failed there too
    assert await until(lambda: rs.state("r2").circuit is CircuitState.OPEN)
    assert not rs.is_routable("r2")
    assert (await post(stack)).status_code == 503  # open: the replica is not tried
    await sim.fault(2)
    assert await until(lambda: rs.is_routable("r2"))  # cool-down over: half-open
    assert rs.state("r2").circuit is CircuitState.HALF_OPEN

    t_probe = time.monotonic()
    await ending.run(stack, sim, monkeypatch)

    # settled: no probe left in flight, the router's load ticket given back
    assert await until(lambda: c.router.loads.snapshot("r2").running_requests == 0), \
        "the router's load ticket was not released"
    assert await until(lambda: not rs.state("r2").probe_in_flight), "the probe is still in flight"
    assert c.router.loads.snapshot("r2").tokens == 0
    st = rs.state("r2")
    if ending.verdict == "success":
        assert st.circuit is CircuitState.CLOSED and st.consecutive_failures == 0 and rs.is_routable("r2")
    elif ending.verdict.startswith("first_byte"):  # R7-2: closed at the probe's first byte
        # a stream cut after the first byte counts one failure of tenant-reg's (replica, tenant) pair:
        # the first byte was a 2xx after tenant-x's failure, so nothing corroborates it (R8-2)
        failures = 1 if ending.verdict.endswith("failure") else 0
        assert st.circuit is CircuitState.CLOSED and st.consecutive_failures == 0 and rs.is_routable("r2")
        assert rs.tenants.streak("r2", "tenant-reg") == failures
    elif ending.verdict == "failure":
        assert st.consecutive_failures == THRESHOLD + 1 and st.opened_at >= t_probe  # re-opened by the probe
    else:
        assert st.consecutive_failures == THRESHOLD and rs.is_routable("r2")  # the next request probes

    # never out for good: once the replica is fine, it serves again
    if name == "connect_refused":
        await sim.revive(2)
    await sim.fault(2)
    assert await until(lambda: rs.is_routable("r2"))
    r = await post(stack)
    assert r.status_code == 200, r.text
    assert rs.state("r2").circuit is CircuitState.CLOSED
    assert c.router.loads.snapshot("r2").running_requests == 0
    assert c.limiter.in_flight("tenant-reg") == 0
