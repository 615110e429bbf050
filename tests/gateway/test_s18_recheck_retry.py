"""Session 18, helper recheck (R17-2): after a request is authorized again when it leaves the flow queue, a retry on
another replica (its first attempt failed before the first byte) stays inside the NEW decision's replicas. Before,
the retry list was the first decision's (gateway/pipeline.py ``_route_and_proxy`` ``remaining``), so the retry
reached a replica the policy had just reserved away from the tenant."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import gateway.pipeline as pipeline
from gateway.proxy import UpstreamFailure
from tests.support import flow
from tests.support.flow import HOLD_UNTIL_CANCELLED, HOLDING_TOKENS, queued
from tests.support.policy_store import policy_store_section
from tests.support.waiting import wait_for

replica_cfg = flow.replica_cfg  # slow decode: the holders hold
POOLS = "/admin/data/prefixgate/config/pools"


@pytest.fixture
def n_replicas() -> int:
    """r0, r1 in pool ``default``; r2 in pool ``eu``."""
    return 3


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    return {**HOLD_UNTIL_CANCELLED, "flow": {"replica_max_running_requests": 1},
            "policy": {**policy_store_section(tmp_path), **HOLD_UNTIL_CANCELLED["policy"]}}


async def reserve(stack: Any, reserved: dict[str, Any]) -> None:
    r = await stack.client.put(f"{stack.admin_url}{POOLS}", content=json.dumps({"reserved": reserved}),
                               headers={**stack.operator_auth(), "Content-Type": "application/json"})
    assert r.status_code == 200, r.text


def send(stack: Any, max_tokens: int, n: int) -> asyncio.Future[Any]:
    """A completion of tenant-a in the background, with prompt ``n`` of its own (no shared prefix: flow
    control does not hold it for another's replica, ``flow.locality_wait_ratio``)."""
    prompt = " ".join(f"p{n}w{i}" for i in range(40))
    return asyncio.ensure_future(stack.client.post(
        "/v1/completions", json={"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens},
        headers=stack.auth(), timeout=None))


def running(stack: Any) -> dict[str, int]:
    loads = stack.components.router.loads
    return {rid: loads.snapshot(rid).running_requests for rid in ("r0", "r1", "r2")}


async def test_a_retry_after_a_re_decision_stays_in_the_new_decision(stack: Any, monkeypatch: Any) -> None:
    # tenant-a may use all three replicas: no pool reserved, both pools in its entitlement
    await reserve(stack, {})
    p = stack.tmp / "gateway.yaml"
    doc = yaml.safe_load(p.read_text())
    for t in doc["tenancy"]["tenants"]:
        if t["id"] == "tenant-a":
            t.update(pools=["default", "eu"], max_output_tokens=HOLDING_TOKENS)
    p.write_text(yaml.safe_dump(doc))
    r = await stack.client.post(f"{stack.admin_url}/admin/tenants/reload", headers=stack.operator_auth())
    assert r.status_code == 200, r.text
    # one holder per replica (room 1 each): the next request queues
    holders: dict[str, asyncio.Future[Any]] = {}
    try:
        for n in range(1, 4):
            before = running(stack)
            h = send(stack, HOLDING_TOKENS, n)
            await wait_for(lambda: sum(running(stack).values()) == n or h.done(), 60, what=f"holder {n} running")
            assert not h.done()
            (rid,) = [k for k, v in running(stack).items() if v > before[k]]
            holders[rid] = h
        r2_url = stack.cluster.urls[2]
        open_upstream = pipeline.open_upstream
        written: list[str] = []

        def r2_refuses(session: Any, url: str, *args: Any) -> Any:  # from now on: r2 refuses connections
            written.append(url)
            if not url.startswith(r2_url):
                return open_upstream(session, url, *args)

            async def refused() -> Any:
                raise UpstreamFailure("connect", "connection refused (test)", reached=False)
            return refused()

        queued_one = send(stack, 20, 0)
        await wait_for(lambda: queued(stack) == 1 or queued_one.done(), 60, what="request queued")
        assert not queued_one.done()
        monkeypatch.setattr(pipeline, "open_upstream", r2_refuses)
        await reserve(stack, {"default": {"data_residency": "none"}})  # tenant-a: r2 only, now
        holders["r2"].cancel()  # room on r2: the queued request is released there
        r = await queued_one
        assert written and all(u.startswith(r2_url) for u in written), written  # before: retried on r0 or r1
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error"
    finally:
        for h in holders.values():
            h.cancel()
        await asyncio.gather(*holders.values(), return_exceptions=True)
