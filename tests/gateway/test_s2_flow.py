"""Flow control on a running gateway (issue 17): replica bounds, queue limits (429 + Retry-After),
a client that leaves the queue, overload shedding before authentication (503) and /readyz."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from gateway.config_flow import FlowConfig
from gateway.metrics import GatewayMetrics
from gateway.overload import OverloadGuard
from policy.input import build_policy_input
from tests.support.flow import (  # noqa: F401 - replica_cfg, n_replicas: this module's stack fixtures
    PROMPT,
    n_replicas,
    one_running_one_queued,
    post,
    queued,
    replica_cfg,
    running,
)
from tests.support.waiting import wait_for


def body(max_tokens: int = 20, prompt: str = PROMPT) -> dict[str, Any]:
    return {"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens}


def capture_records(stack, monkeypatch) -> list[Any]:
    recs: list[Any] = []
    rec = stack.components.recorder
    orig = rec.record
    monkeypatch.setattr(rec, "record", lambda r: (recs.append(r), orig(r))[1])
    return recs


@pytest.mark.parametrize("config_overrides", [{"flow": {"replica_max_running_requests": 1}}])
async def test_requests_beyond_replica_room_wait_at_the_gateway(stack, monkeypatch) -> None:
    recs = capture_records(stack, monkeypatch)
    seen: list[int] = []
    tasks = [post(stack) for _ in range(3)]
    await wait_for(lambda: queued(stack) == 2 and running(stack) == 1, what="one running, two queued")

    async def watch() -> None:
        while not all(t.done() for t in tasks):
            seen.append(running(stack))
            await asyncio.sleep(0.01)

    await watch()
    assert [t.result().status_code for t in tasks] == [200, 200, 200]
    assert max(seen) == 1  # the replica never had more than its bound
    waits = sorted(r.queue_wait_ms for r in recs)
    assert waits[0] is not None and waits[-1] > 0  # the queued ones recorded their wait
    assert all(r.virtual_tokens is not None and r.virtual_tokens > 0 for r in recs)


@pytest.mark.parametrize("config_overrides", [{"flow": {"replica_max_running_requests": 1}}])
async def test_client_that_leaves_is_removed_from_the_queue_at_once(stack) -> None:
    first, second = await one_running_one_queued(stack, 400)
    second.cancel()  # the client hangs up while queued
    await asyncio.gather(second, return_exceptions=True)
    await wait_for(lambda: queued(stack) == 0, what="queue emptied")
    assert not first.done() and running(stack) == 1  # removed while the replica was still busy
    assert stack.components.flow.tenant_queued("tenant-a") == 0
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)


@pytest.mark.parametrize("config_overrides", [{"flow": {"replica_max_running_requests": 1,
                                                        "tenant_max_queued_requests": 1}}])
async def test_queue_full_is_429_with_retry_after(stack) -> None:
    first, second = await one_running_one_queued(stack, 200)
    r = await stack.client.post("/v1/completions", json=body(), headers=stack.auth())
    assert r.status_code == 429
    assert int(r.headers["Retry-After"]) >= 1
    err = r.json()["error"]
    assert err["code"] == "queue_full" and isinstance(err["message"], str)
    # refused at the door: before the body is read (an invalid body is not even looked at)
    r = await stack.client.post("/v1/completions", content=b"{not json",
                                headers={**stack.auth(), "content-type": "application/json"})
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
    # another tenant's queue is its own: tenant-b is queued, not refused
    third = post(stack, workload="tenant-b/app")
    await wait_for(lambda: stack.components.flow.tenant_queued("tenant-b") == 1, what="tenant-b queued")
    for t in (first, second, third):
        t.cancel()
    await asyncio.gather(first, second, third, return_exceptions=True)


@pytest.mark.parametrize("config_overrides", [{"flow": {"replica_max_running_requests": 1,
                                                        "tenant_max_queue_wait_s": 0.3}}])
async def test_queue_wait_limit_is_429_with_retry_after(stack) -> None:
    first = post(stack, 200)
    await wait_for(lambda: running(stack) == 1, what="first request running")
    r = await stack.client.post("/v1/completions", json=body(), headers=stack.auth())
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_timeout"
    assert int(r.headers["Retry-After"]) >= 1
    assert queued(stack) == 0 and not first.done()
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)


@pytest.mark.parametrize("config_overrides", [{"flow": {"shed_max_in_flight_requests": 2, "tenant_max_queued_requests": 1}}])
async def test_overload_is_shed_before_authentication_and_readyz_says_so(stack, monkeypatch) -> None:
    calls: list[Any] = []
    authn = stack.components.authn
    orig = authn.authenticate

    async def counting(request: Any, *rest: Any) -> Any:
        calls.append(request)
        return await orig(request, *rest)

    monkeypatch.setattr(authn, "authenticate", counting)
    # two tenants: one alone cannot reach the bound (its cap, flow.tenant_max_in_flight_requests, is 1 here)
    busy = [post(stack, 400, f"{t}/app") for t in ("tenant-a", "tenant-b")]
    await wait_for(lambda: stack.components.overload.in_flight == 2, what="two requests in flight")
    n_auth = len(calls)
    r = await stack.client.post("/v1/completions", json=body())  # no credentials at all
    assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded"
    assert int(r.headers["Retry-After"]) >= 1
    assert len(calls) == n_auth  # no authentication work was spent on it
    ready = await stack.client.get("/readyz")
    assert ready.status_code == 503 and any("overloaded" in p for p in ready.json()["problems"])
    for t in busy:
        t.cancel()
    await asyncio.gather(*busy, return_exceptions=True)
    await wait_for(lambda: stack.components.overload.in_flight == 0, what="requests ended")
    assert (await stack.client.get("/readyz")).status_code == 200
    r = await stack.client.post("/v1/completions", json=body())
    assert r.status_code == 401  # not shed any more: authentication answers
    metrics = (await stack.client.get("/metrics")).text
    assert 'prefixgate_shed_requests_total{reason="in_flight"} 1.0' in metrics


def test_loop_lag_sheds_and_is_reported() -> None:
    guard = OverloadGuard(FlowConfig(shed_loop_lag_s=0.5), GatewayMetrics())
    assert guard.shed() is None and guard.problems() == []
    guard.lag_s = 0.8
    shed = guard.shed()
    assert shed is not None and shed.status_code == 503 and shed.headers["Retry-After"] == "1"
    assert guard.problems() and "event loop lag" in guard.problems()[0]


def test_policy_input_carries_queue_state() -> None:
    doc = build_policy_input({"spiffe_id": "spiffe://td/a", "trust_domain": "td"},
                             {"id": "t", "models": [], "pools": []},
                             {"endpoint": "/v1/completions", "model": "m", "queued_requests": 3}, [], [], 0.0)
    assert doc["request"]["queued_requests"] == 3
    doc = build_policy_input({"spiffe_id": "spiffe://td/a", "trust_domain": "td"},
                             {"id": "t", "models": [], "pools": []},
                             {"endpoint": "/v1/completions", "model": "m"}, [], [], 0.0)
    assert doc["request"]["queued_requests"] == 0


async def test_default_config_does_not_queue(stack, monkeypatch) -> None:
    """Default bounds: a handful of concurrent requests never wait at the gateway."""
    recs = capture_records(stack, monkeypatch)
    rs = await asyncio.gather(*(stack.client.post("/v1/completions", json=body(max_tokens=2), headers=stack.auth())
                                for _ in range(8)))
    assert all(r.status_code == 200 for r in rs)
    assert all(r.queue_wait_ms is not None for r in recs) and stack.components.flow.queue.backlogged() == []
    assert isinstance(stack.client, httpx.AsyncClient)
