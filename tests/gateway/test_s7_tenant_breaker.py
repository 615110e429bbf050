"""Review R7b-1: one tenant whose input makes a replica answer 503 (or drop the connection) must not
open the replicas' shared circuits for every tenant; a replica failing for all tenants still must.

Fake replicas (aiohttp, in this file) answer a normal completion, or, to any prompt holding
``POISON`` (or to every request when ``fail_all``), a 503 or a dropped connection (``mode``).
Before the fix tenant-a's poison counted against both replicas' shared circuits (and was retried on
the second), so tenant-b got 503 ``no_replica``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web

from gateway.replicas import CircuitState
from tests.support.fake_replicas import (  # noqa: F401 - n_replicas: this module's stack fixture
    PLAIN_ANSWER, base_app, completion, n_replicas, serving)
from tests.support.waiting import wait_for


@dataclass
class Fake:
    """One fake replica's switches and counters."""

    url: str = ""
    mode: str = "503"
    healthy: bool = True
    fail_all: bool = False
    poison_hits: int = 0
    ok: int = 0


def _app(fake: Fake) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if fake.fail_all or "POISON" in str(body.get("prompt", "")):
            fake.poison_hits += 1
            if fake.mode == "reset":
                assert request.transport is not None
                request.transport.abort()
                raise web.HTTPServiceUnavailable()  # never reaches the client: the connection is gone
            return web.json_response({"error": {"message": "overloaded by this input"}}, status=503)
        fake.ok += 1
        return web.json_response(PLAIN_ANSWER)

    return base_app(fake, completions)


@pytest.fixture
async def fakes() -> AsyncIterator[list[Fake]]:
    async with serving([Fake() for _ in range(2)], _app) as out:
        yield out


@pytest.fixture
def config_overrides(fakes: list[Fake]) -> dict[str, Any]:
    return {
        "replicas": [{"id": "f0", "url": fakes[0].url, "pool": "default"},
                     {"id": "f1", "url": fakes[1].url, "pool": "default"}],
        "health": {"interval_s": 0.1, "timeout_s": 2.0, "unhealthy_after": 1, "healthy_after": 1,
                   "breaker_failures": 3, "breaker_cooldown_s": 1.5},
    }



async def _served_on_both(stack: Any, fakes: list[Fake], tenant: str) -> None:
    """One successful request of ``tenant`` on each replica (the other one marked down meanwhile)."""
    rs = stack.components.replica_set
    for down, up in ((1, "f0"), (0, "f1")):
        fakes[down].healthy, fakes[1 - down].healthy = False, True
        await wait_for(lambda up=up: rs.routable_ids() == [up], what=f"only {up} routable")
        r = await stack.client.post("/v1/completions", json=completion("hello"), headers=stack.auth(tenant))
        assert r.status_code == 200, r.text
    fakes[0].healthy = fakes[1].healthy = True
    await wait_for(lambda: rs.routable_ids() == ["f0", "f1"], what="both routable")


@pytest.mark.parametrize("mode", ["503", "reset"])
async def test_one_tenants_failures_open_only_its_own_circuits(stack: Any, fakes: list[Fake], mode: str,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    rs = stack.components.replica_set
    fakes[0].mode = fakes[1].mode = mode
    await wait_for(lambda: rs.routable_ids() == ["f0", "f1"], what="fake replicas healthy")
    await _served_on_both(stack, fakes, "tenant-b/app")
    a_statuses = []
    for round_ in range(4):
        for i in range(3):  # tenant-a sends more poison than tenant-b sends requests
            r = await stack.client.post("/v1/completions", json=completion(f"POISON {round_} {i}"),
                                        headers=stack.auth("tenant-a/app"))
            a_statuses.append(r.status_code)
            assert r.status_code in (502, 503) and "this input" not in r.text  # never the replica's own text
        r = await stack.client.post("/v1/completions", json=completion(f"hello {round_}"),
                                    headers=stack.auth("tenant-b/app"))
        assert r.status_code == 200, r.text  # before R7b-1: 503 no_replica
    assert rs.state("f0").circuit is CircuitState.CLOSED and rs.state("f1").circuit is CircuitState.CLOSED
    # tenant-a's own circuits opened on both replicas: its requests get 503 without reaching one
    assert a_statuses[-1] == 503
    hits = fakes[0].poison_hits + fakes[1].poison_hits
    # threshold per replica, plus the one retry of a first failure; a reset is sent twice when it hits a
    # kept-alive connection (the pool's own single resend, gateway/upstream_pool.py)
    assert hits <= (2 * 3 + 1) * (2 if mode == "reset" else 1)
    r = await stack.client.post("/v1/completions", json=completion("hello"), headers=stack.auth("tenant-a/app"))
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_replica"
    r = await stack.client.post("/v1/completions", json=completion("hello"), headers=stack.auth("tenant-b/app"))
    assert r.status_code == 200, r.text
    opened = [r.getMessage() for r in caplog.records if "circuit opened for tenant" in r.getMessage()]
    assert opened and all("tenant-a" in m and "POISON" not in m for m in opened)  # ids only, no prompt text
    text = await stack.admin_metrics()
    assert 'prefixgate_tenant_circuits_opened_total{replica="f0",tenant="tenant-a"} 1.0' in text
    assert 'tenant="tenant-b"' not in text.split("prefixgate_tenant_circuits_opened_total", 1)[1].split("# HELP")[0]
    # after the cool-down tenant-a's circuits close: a normal request of its own is served
    async def a_served() -> bool:
        r = await stack.client.post("/v1/completions", json=completion("fine"), headers=stack.auth("tenant-a/app"))
        return r.status_code == 200
    for _ in range(100):
        if await a_served():
            break
        await wait_for(lambda: not rs.tenants.any_open(), what="tenant circuits cooled down")
    else:
        raise AssertionError("tenant-a never served again")


async def test_a_replica_failing_for_all_tenants_opens_the_shared_circuit(stack: Any, fakes: list[Fake]) -> None:
    rs = stack.components.replica_set
    await wait_for(lambda: rs.routable_ids() == ["f0", "f1"], what="fake replicas healthy")
    await _served_on_both(stack, fakes, "tenant-b/app")
    await _served_on_both(stack, fakes, "tenant-a/app")
    fakes[0].fail_all = True
    for i in range(20):
        tenant = "tenant-a/app" if i % 2 else "tenant-b/app"
        r = await stack.client.post("/v1/completions", json=completion(f"x {i}"), headers=stack.auth(tenant))
        assert r.status_code in (200, 502, 503), r.text
        if rs.state("f0").circuit is CircuitState.OPEN:
            break
    assert rs.state("f0").circuit is CircuitState.OPEN
    assert rs.state("f1").circuit is CircuitState.CLOSED
