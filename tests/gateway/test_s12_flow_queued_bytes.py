"""Review R12-2: one tenant's queued requests are bounded by the bytes of their bodies
(``flow.tenant_max_queued_bytes``), not only by their count; the bytes return on every ending."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.flow_bytes import QueuedBytes
from tests.support.flow import n_replicas, queued, replica_cfg, running  # noqa: F401 - stack fixtures
from tests.support.waiting import wait_for

#: a ~8 kB prompt (800 words): each queued body is ~7.3 kB, counted ~10.5 kB with its prefix chain
#: (session 14, review RV2-6: gateway/flow_bytes.py chain_bytes)
BIG = " ".join(f"word{i:04d}" for i in range(800))
BOUND = 36_000  # three such requests (~10.5 kB each) fit, a fourth does not


def test_queued_bytes_take_and_give_back() -> None:
    qb = QueuedBytes(100)
    assert qb.take("a", 150)  # nothing queued: one request always fits, whatever its size
    assert not qb.take("a", 1)
    assert qb.take("b", 60) and qb.take("b", 40) and not qb.take("b", 1)
    qb.give_back("a", 150)
    assert qb.held("a") == 0 and qb.take("a", 90)
    qb.give_back("a", 90)
    qb.give_back("b", 60)
    qb.give_back("b", 40)
    assert qb.total() == 0


def _post(stack: Any, workload: str, prompt: str, max_tokens: int) -> asyncio.Future[Any]:
    return asyncio.ensure_future(stack.client.post(
        "/v1/completions", json={"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens},
        headers=stack.auth(workload)))


@pytest.mark.parametrize("config_overrides", [{
    "flow": {"replica_max_running_requests": 1, "tenant_max_queued_bytes": BOUND},
    "tenancy": {"tenants": [
        {"id": "tenant-a", "spiffe_ids": ["spiffe://demo.prefixgate.test/tenant-a/"], "models": ["sim-model"],
         "pools": ["default"], "max_output_tokens": 256},
        {"id": "tenant-b", "spiffe_ids": ["spiffe://demo.prefixgate.test/tenant-b/"], "models": ["sim-model"],
         "pools": ["default"], "max_output_tokens": 256}]},
}])
async def test_queued_bodies_are_bounded_by_bytes_per_tenant(stack: Any, monkeypatch: Any) -> None:
    flow = stack.components.flow
    events: list[Any] = []
    hub = stack.components.audit
    emit = hub.emit_request
    monkeypatch.setattr(hub, "emit_request", lambda rec: (events.append(rec), emit(rec))[1])
    first = _post(stack, "tenant-a/app", "short one", 250)  # ~12 s on the replica: the others queue
    await wait_for(lambda: running(stack) == 1, what="first request running")
    waiting = []
    for i in range(3):
        waiting.append(_post(stack, "tenant-a/app", f"q{i} " + BIG, 2))
        await wait_for(lambda n=i + 1: queued(stack) == n, what=f"{i + 1} queued")
    held = flow.queued_bytes.held("tenant-a")
    assert 3 * len(BIG) < held <= BOUND
    r = await stack.client.post("/v1/completions", headers=stack.auth("tenant-a/app"),
                                json={"model": "sim-model", "prompt": "q3 " + BIG, "max_tokens": 2})
    assert queued(stack) == 3 and running(stack) == 1
    assert r.status_code == 429, r.text  # refused by bytes: 3 queued requests are far below the count bound
    assert r.json()["error"]["code"] == "queue_full" and r.headers.get("retry-after")
    refused = [e for e in events if e.status == 429]
    assert refused and refused[-1].error_code == "queue_full" and refused[-1].tenant_id == "tenant-a"
    assert refused[-1].queue_wait_ms == 0.0  # the queue refusal's figures (gateway/flow.py _refusal)
    assert flow.queued_bytes.held("tenant-a") == held  # the refusal took nothing
    other = _post(stack, "tenant-b/app", "b " + BIG, 2)  # another tenant's bytes are its own
    await wait_for(lambda: flow.queued_bytes.held("tenant-b") > 0, what="tenant-b queued")
    waiting[1].cancel()  # a client that hangs up while queued gives its bytes back at once
    await wait_for(lambda: flow.queued_bytes.held("tenant-a") < held, what="the cancelled request's bytes back")
    first.cancel()  # the replica's room goes to the queued ones
    await asyncio.gather(first, return_exceptions=True)
    assert (await other).status_code == 200
    for t in (waiting[0], waiting[2]):
        assert (await t).status_code == 200
    await wait_for(lambda: flow.queued_bytes.total() == 0, what="every queued byte given back")
    assert len(flow.queue) == 0


@pytest.mark.parametrize("config_overrides", [{
    "flow": {"replica_max_running_requests": 1, "tenant_max_queue_wait_s": 0.3},
}])
async def test_a_timed_out_queued_request_gives_its_bytes_back(stack: Any) -> None:
    flow = stack.components.flow
    first = _post(stack, "tenant-a/app", "short one", 40)
    await wait_for(lambda: running(stack) == 1, what="first request running")
    r = await stack.client.post("/v1/completions", headers=stack.auth("tenant-a/app"),
                                json={"model": "sim-model", "prompt": BIG, "max_tokens": 2})
    assert r.status_code == 429 and r.json()["error"]["code"] == "queue_timeout", r.text
    assert flow.queued_bytes.total() == 0
    assert (await first).status_code == 200
