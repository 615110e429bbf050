"""Review R8-2 / R8-4 (and the R7b-1 start-up residual), end to end against fake replicas.

R8-2: one tenant's gateway failures opened a replica's *shared* circuit whenever no other tenant had
succeeded there for 60 s (at start-up, or after a quiet minute): every tenant then got 503
``no_replica``. R8-4: a tenant whose requests got 4xx answers from a broken replica counted as
"the replica serves others", so another tenant's failures there were attributed to it alone and not
retried (502s). The fakes are session 7's (tests/gateway/test_s7_tenant_breaker.py: 503 to a prompt
holding ``POISON``, or to every completion when ``fail_all``), plus a 400 to a prompt holding ``BAD``
answered without the engine (as an API server validates input), also while ``fail_all``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

from gateway.replicas import CircuitState
from tests.gateway.test_s7_tenant_breaker import Fake, _served_on_both, completion
from tests.gateway.test_s7_tenant_breaker import _app as _s7_app
from tests.support import fake_replicas
from tests.support.fake_replicas import serving
from tests.support.waiting import wait_for
from tests.gateway import test_s7_tenant_breaker as s7


def _app(fake: Fake) -> web.Application:
    """Session 7's fake replica behind a middleware answering 400 to 'BAD' prompts."""
    inner = _s7_app(fake)

    @web.middleware
    async def bad_input(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path == "/v1/completions" and "BAD" in str((await request.json()).get("prompt", "")):
            return web.json_response({"error": {"message": "bad input"}}, status=400)
        return await handler(request)

    app = web.Application(middlewares=[bad_input])
    for route in inner.router.routes():
        app.router.add_route(route.method, route.resource.canonical, route.handler)
    return app


@pytest.fixture
async def fakes() -> AsyncIterator[list[Fake]]:
    async with serving([Fake() for _ in range(2)], _app) as out:
        yield out


n_replicas = fake_replicas.n_replicas  # fixture: the simulated cluster is not used here
config_overrides = s7.config_overrides  # fixture (two fakes, breaker 3 / 1.5 s)




async def _post(stack: Any, tenant: str, prompt: str) -> int:
    r = await stack.client.post("/v1/completions", json=completion(prompt), headers=stack.auth(tenant))
    return int(r.status_code)


async def test_one_tenant_alone_never_opens_a_shared_circuit(stack: Any, fakes: list[Fake]) -> None:
    """Start-up (R7b-1 residual) = after a quiet window (R8-2): no other tenant's recent success on
    either replica. tenant-a's poison opens its own pairs only; tenant-b is served at once.
    Before the fix: both shared circuits OPEN, tenant-b 503 no_replica."""
    rs = stack.components.replica_set
    await wait_for(lambda: rs.routable_ids() == ["f0", "f1"], what="fake replicas healthy")
    statuses = [await _post(stack, "tenant-a/app", f"POISON {i}") for i in range(8)]
    assert all(s in (502, 503) for s in statuses), statuses
    assert rs.state("f0").circuit is CircuitState.CLOSED and rs.state("f1").circuit is CircuitState.CLOSED
    assert rs.tenants.blocked("f0", "tenant-a") and rs.tenants.blocked("f1", "tenant-a")
    assert statuses[-1] == 503  # its own circuits: answered without reaching a replica
    assert await _post(stack, "tenant-b/app", "hello") == 200
    # bounded engine work: per replica the pair threshold, each first failure retried once elsewhere
    assert fakes[0].poison_hits + fakes[1].poison_hits <= 2 * 3 + 2


async def test_4xx_answers_are_no_evidence_that_a_broken_replica_serves_others(stack: Any, fakes: list[Fake]) -> None:
    """R8-4: f0 breaks for real (503 to every completion) but still answers 400 to tenant-a's BAD
    input. tenant-b's failures on f0 are not blamed on tenant-b's input: they are retried on f1 and
    tenant-b gets no error. Before the fix: 4 to 5 x 502 in 40 requests (attributed, not retried)."""
    rs = stack.components.replica_set
    await wait_for(lambda: rs.routable_ids() == ["f0", "f1"], what="fake replicas healthy")
    await _served_on_both(stack, fakes, "tenant-b/app")
    fakes[0].fail_all = True
    statuses_b = []
    for i in range(40):
        for j in range(2):
            assert await _post(stack, "tenant-a/app", f"BAD {i} {j}") == 400
        statuses_b.append(await _post(stack, "tenant-b/app", f"x {i}"))
        if i % 8 == 7:  # let tenant-b's pair on f0 cool down now and then, so f0 is tried again
            await wait_for(lambda: not rs.tenants.blocked("f0", "tenant-b"), what="tenant-b's f0 pair cooled down")
    assert statuses_b == [200] * 40, statuses_b
    assert fakes[0].poison_hits >= 4  # f0 was really tried (and failed) several times


async def test_a_real_fault_seen_by_one_tenant_then_another_opens_the_shared_circuit(stack: Any, fakes: list[Fake]) -> None:
    """A replica broken for everybody, used by one tenant first: that tenant's pair circuit opens
    (it is protected; its failures are retried elsewhere). Session 8: the shared circuit opened once a
    second tenant failed there too. Since session 10 the pair's opening makes the gateway send its own
    request there, which fails too, so the shared circuit opens without waiting for a second tenant
    (the corroboration path: tests/security/test_s10_breaker_collusion.py,
    tests/gateway/test_s7_query_of_death.py)."""
    rs = stack.components.replica_set
    await wait_for(lambda: rs.routable_ids() == ["f0", "f1"], what="fake replicas healthy")
    fakes[0].fail_all = True
    statuses = [await _post(stack, "tenant-b/app", f"b {i}") for i in range(12)]
    assert statuses == [200] * 12, statuses  # retried on f1 (no evidence against tenant-b's input)
    assert rs.tenants.blocked("f0", "tenant-b")
    await wait_for(lambda: rs.state("f0").opened_at > 0, what="the gateway's own request failed: shared opened")
    for i in range(4):
        assert await _post(stack, "tenant-a/app", f"a {i}") == 200
    assert rs.state("f1").circuit is CircuitState.CLOSED


@pytest.fixture
def short_window(config_overrides: dict[str, Any]) -> dict[str, Any]:
    config_overrides["health"]["breaker_tenant_window_s"] = 0.25
    return config_overrides


@pytest.mark.usefixtures("short_window")
async def test_the_window_is_configurable_and_reaches_the_breaker(stack: Any) -> None:
    assert stack.components.replica_set.tenants.window_s == 0.25
