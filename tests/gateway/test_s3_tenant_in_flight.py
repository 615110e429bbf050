"""Review finding R2-1: one tenant alone cannot push the gateway to its overload-shedding bound.

Shedding (``flow.shed_max_in_flight_requests``) runs before authentication and so answers 503 to
every tenant alike. A tenant's requests in flight are bounded by
``flow.tenant_max_in_flight_requests`` (below the shedding bound, enforced by the configuration),
even without ``max_concurrency``: beyond it the tenant gets 429 ``in_flight_limited`` while
other tenants are still served and nothing is shed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.config_flow import FlowConfig
from tests.support.flow import PROMPT, n_replicas, replica_cfg  # noqa: F401 - fixtures: one slow replica
from tests.support.waiting import wait_for

SHED = 8
CAP = 4


def test_default_cap_is_below_the_shedding_bound() -> None:
    cfg = FlowConfig()
    assert cfg.tenant_in_flight_bound() == 256 < cfg.shed_max_in_flight_requests
    assert FlowConfig(shed_max_in_flight_requests=2, tenant_max_queued_requests=1).tenant_in_flight_bound() == 1


@pytest.mark.parametrize("cap,shed", [(8, 8), (9, 8), (1024, 1024)])
def test_a_cap_reaching_the_shedding_bound_is_refused(cap: int, shed: int) -> None:
    with pytest.raises(ValueError, match="tenant_max_in_flight_requests must be below shed_max_in_flight_requests"):
        FlowConfig(tenant_max_in_flight_requests=cap, shed_max_in_flight_requests=shed,
                   tenant_max_queued_requests=1)


def _flow(enabled: bool) -> dict[str, Any]:
    return {"flow": {"enabled": enabled, "shed_max_in_flight_requests": SHED, "tenant_max_in_flight_requests": CAP,
                     "tenant_max_queued_requests": 2}}


@pytest.mark.parametrize("config_overrides", [_flow(True), _flow(False)], ids=["flow-on", "flow-off"])
async def test_one_tenant_flooding_past_the_shedding_bound_gets_429_and_others_are_served(stack: Any) -> None:
    token_a, token_b = stack.token("tenant-a/app"), stack.token("tenant-b/app")  # no max_concurrency either

    def post(token: str, max_tokens: int) -> asyncio.Future[Any]:
        return asyncio.ensure_future(stack.client.post(
            "/v1/completions", json={"model": "sim-model", "prompt": PROMPT, "max_tokens": max_tokens},
            headers={"Authorization": f"Bearer {token}"}))

    guard = stack.components.overload
    long_a = [post(token_a, 200) for _ in range(CAP)]  # ~10 s each: held in flight
    await wait_for(lambda: guard.tenant_in_flight.get("tenant-a") == CAP, what="a's cap reached")
    flood = [post(token_a, 4) for _ in range(3 * SHED)]  # more concurrent requests than the shedding bound
    answers = await asyncio.gather(*flood)
    assert {r.status_code for r in answers} == {429}, [r.text for r in answers if r.status_code != 429]
    assert {r.json()["error"]["code"] for r in answers} == {"in_flight_limited"}
    assert all(int(r.headers["Retry-After"]) >= 1 for r in answers)
    assert guard.in_flight < SHED and guard.reason() is None
    r_b = await post(token_b, 4)  # another tenant is still served
    assert r_b.status_code == 200, r_b.text
    metrics = await stack.admin_metrics()  # flow refusals: operators only (R3-5)
    shed = [ln for ln in metrics.splitlines() if ln.startswith("prefixgate_shed_requests_total{")]
    assert all(ln.endswith(" 0.0") for ln in shed), shed  # nothing was shed
    assert f'prefixgate_flow_refused_total{{reason="in_flight"}} {float(3 * SHED)}' in metrics
    for t in long_a:
        t.cancel()
    await asyncio.gather(*long_a, return_exceptions=True)
    await wait_for(lambda: guard.in_flight == 0 and not guard.tenant_in_flight, what="counts given back")
    r = await post(token_a, 4)  # below its cap again: served
    assert r.status_code == 200, r.text
