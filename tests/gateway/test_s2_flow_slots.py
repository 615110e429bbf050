"""Issue 17: a queued request holds no tenant concurrency slot (in-process limiter).

With flow control on, admission takes the request unit only; the tenant's
concurrency slot is taken when the dispatcher releases the request from its
queue. A tenant at ``max_concurrency`` keeps its further requests queued (up
to ``flow.tenant_max_queued_requests``) until a slot frees; other tenants are
released meanwhile. With flow control off the slot is taken at admission, as
before (429 ``concurrency_limited`` at once).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.conftest import TD
from tests.support.flow import n_replicas, post, replica_cfg  # noqa: F401 - n_replicas, replica_cfg: stack fixtures
from tests.support.waiting import wait_for


def _tenants(max_concurrency: int) -> list[dict[str, Any]]:
    return [
        {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"],
         "pools": ["default"], "max_output_tokens": 400, "max_concurrency": max_concurrency},
        {"id": "tenant-b", "spiffe_ids": [f"spiffe://{TD}/tenant-b/"], "models": ["sim-model"],
         "pools": ["default"], "max_output_tokens": 400},
    ]


def _post(stack: Any, tenant: str, max_tokens: int) -> asyncio.Future[Any]:
    return post(stack, max_tokens, f"{tenant}/app")


def _slots(stack: Any) -> int:
    return stack.components.limiter.in_flight("tenant-a")


@pytest.mark.parametrize("config_overrides", [{"flow": {"replica_max_running_requests": 1},
                                               "tenancy": {"tenants": _tenants(1)}}])
async def test_a_request_queued_for_replica_room_holds_no_slot(stack: Any) -> None:
    flow = stack.components.flow
    busy = _post(stack, "tenant-b", 400)  # fills the one replica's room
    await wait_for(lambda: stack.components.router.loads.snapshot("r0").running_requests == 1, what="b running")
    first = _post(stack, "tenant-a", 4)
    await wait_for(lambda: flow.tenant_queued("tenant-a") == 1, what="a queued")
    assert _slots(stack) == 0  # before issue 17's fix: 1 (taken at admission)
    second = _post(stack, "tenant-a", 4)  # before: 429 concurrency_limited (the queued one held the slot)
    await wait_for(lambda: flow.tenant_queued("tenant-a") == 2, what="a's second request queued too")
    assert _slots(stack) == 0
    busy.cancel()
    await asyncio.gather(busy, return_exceptions=True)
    r1, r2 = await asyncio.gather(first, second)
    assert (r1.status_code, r2.status_code) == (200, 200), (r1.text, r2.text)
    await wait_for(lambda: _slots(stack) == 0, what="slots given back")


@pytest.mark.parametrize("config_overrides", [{"tenancy": {"tenants": _tenants(1)}}])
async def test_a_tenant_at_its_concurrency_queues_and_others_go_first(stack: Any, monkeypatch: Any) -> None:
    flow = stack.components.flow
    peak = 0
    limiter = stack.components.limiter
    orig = limiter.take_slots

    def watched(*a: Any, **kw: Any) -> None:
        nonlocal peak
        orig(*a, **kw)
        peak = max(peak, limiter.in_flight("tenant-a"))

    monkeypatch.setattr(limiter, "take_slots", watched)
    long_a = _post(stack, "tenant-a", 400)  # holds a's only slot for ~20 s
    await wait_for(lambda: _slots(stack) == 1, what="a's first request running")
    waiting_a = _post(stack, "tenant-a", 4)  # the replica has room; a has no slot: it waits in the queue
    await wait_for(lambda: flow.tenant_queued("tenant-a") == 1, what="a's second request queued for a slot")
    r_b = await _post(stack, "tenant-b", 4)  # work-conserving: b is not held behind a's wait
    assert r_b.status_code == 200
    assert not waiting_a.done() and flow.tenant_queued("tenant-a") == 1
    long_a.cancel()  # a's slot frees: the queued request takes it
    await asyncio.gather(long_a, return_exceptions=True)
    r = await waiting_a
    assert r.status_code == 200, r.text
    assert peak == 1  # never more than max_concurrency released
    await wait_for(lambda: _slots(stack) == 0, what="slots given back")


@pytest.mark.parametrize("config_overrides", [{"flow": {"enabled": False}, "tenancy": {"tenants": _tenants(1)}}])
async def test_without_flow_control_the_slot_is_taken_at_admission(stack: Any) -> None:
    long_a = _post(stack, "tenant-a", 400)
    await wait_for(lambda: _slots(stack) == 1, what="a's first request running")
    r = await _post(stack, "tenant-a", 4)
    assert r.status_code == 429 and r.json()["error"]["code"] == "concurrency_limited"
    long_a.cancel()
    await asyncio.gather(long_a, return_exceptions=True)
    await wait_for(lambda: _slots(stack) == 0, what="slot given back")


@pytest.mark.parametrize("config_overrides", [{"flow": {"tenant_max_queued_requests": 1},
                                               "tenancy": {"tenants": _tenants(1)}}])
async def test_a_tenant_over_its_concurrency_cannot_grow_an_unbounded_queue(stack: Any) -> None:
    flow = stack.components.flow
    long_a = _post(stack, "tenant-a", 400)
    await wait_for(lambda: _slots(stack) == 1, what="a's first request running")
    queued = _post(stack, "tenant-a", 4)
    await wait_for(lambda: flow.tenant_queued("tenant-a") == 1, what="one queued for a slot")
    r = await _post(stack, "tenant-a", 4)
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_full"
    assert int(r.headers["Retry-After"]) >= 1
    for t in (long_a, queued):
        t.cancel()
    await asyncio.gather(long_a, queued, return_exceptions=True)
    await wait_for(lambda: _slots(stack) == 0 and flow.tenant_queued("tenant-a") == 0, what="all given back")
