"""Session 18, helper recheck (R17-5 (c), flow control off): the policy generation is compared right before every
attempt's upstream write, not only when a request leaves the flow queue. A registry reload acknowledged while a
request is still being admitted (its body read: the tenant was resolved before) or while its first attempt fails
holds for it: it is authorized again (gateway/pep_recheck.py) and refused as a fresh request would be. Before,
both were served on the old facts (the generation was read after the body, and compared only at a queue release)."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

import gateway.pipeline as pipeline
from gateway.proxy import UpstreamFailure
from tests.support.policy_store import policy_store_section

BODY = {"model": "sim-model", "prompt": "hello there", "max_tokens": 4}


POOLS = "/admin/data/prefixgate/config/pools"


@pytest.fixture
def config_overrides(tmp_path: Path) -> dict[str, Any]:
    """Flow control off; a policy store (the re-route case reserves a pool); r0, r1 in ``default``, r2 in ``eu``."""
    return {"flow": {"enabled": False}, "policy": policy_store_section(tmp_path)}


async def revoke_model(stack: Any) -> None:
    """Reload the tenants with tenant-a's model entitlement revoked (200 expected)."""
    p = stack.tmp / "gateway.yaml"
    doc = yaml.safe_load(p.read_text())
    for t in doc["tenancy"]["tenants"]:
        if t["id"] == "tenant-a":
            t["models"] = ["other-model"]
    p.write_text(yaml.safe_dump(doc))
    r = await stack.client.post(f"{stack.admin_url}/admin/tenants/reload", headers=stack.operator_auth())
    assert r.status_code == 200, r.text


async def test_a_reload_while_the_body_is_read_holds_for_that_request(stack: Any, monkeypatch: Any) -> None:
    entered, go = asyncio.Event(), asyncio.Event()
    read_body = pipeline.read_body

    async def slow_upload(*args: Any, **kw: Any) -> bytes:  # the tenant is resolved; its body still arriving
        entered.set()
        await go.wait()
        return await read_body(*args, **kw)

    monkeypatch.setattr(pipeline, "read_body", slow_upload)
    pending = asyncio.ensure_future(stack.client.post("/v1/completions", json=BODY, headers=stack.auth()))
    try:
        await asyncio.wait_for(entered.wait(), 30)
        await revoke_model(stack)
        go.set()
        r = await pending
    finally:
        pending.cancel()
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"  # before: 200
    fresh = await stack.client.post("/v1/completions", json=BODY, headers=stack.auth())
    assert (fresh.status_code, fresh.content) == (404, r.content)


async def test_a_reload_during_a_failed_attempt_holds_for_the_retry(stack: Any, monkeypatch: Any) -> None:
    open_upstream = pipeline.open_upstream
    urls: list[str] = []

    def first_fails_after_a_reload(session: Any, url: str, *args: Any) -> Any:
        urls.append(url)
        if len(urls) > 1:
            return open_upstream(session, url, *args)

        async def refused() -> Any:  # the replica refuses the connection while the operator revokes
            await revoke_model(stack)
            raise UpstreamFailure("connect", "connection refused (test)", reached=False)
        return refused()

    monkeypatch.setattr(pipeline, "open_upstream", first_fails_after_a_reload)
    r = await stack.client.post("/v1/completions", json=BODY, headers=stack.auth())
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"  # before: 200 from the retry
    assert len(urls) == 1  # the retry was never written


async def test_a_replica_the_router_chose_outside_the_new_decision_is_chosen_again(
        stack: Any, monkeypatch: Any) -> None:
    """Flow control off, a retry after a change: the router's choice is made before the compare; a replica
    the new decision excludes is replaced by one it allows (never written to), not refused."""
    async def reserve(reserved: dict[str, Any]) -> None:
        r = await stack.client.put(f"{stack.admin_url}{POOLS}", content=json.dumps({"reserved": reserved}),
                                   headers={**stack.operator_auth(), "Content-Type": "application/json"})
        assert r.status_code == 200, r.text

    await reserve({})  # tenant-a may use r0, r1 and r2
    p = stack.tmp / "gateway.yaml"
    doc = yaml.safe_load(p.read_text())
    for t in doc["tenancy"]["tenants"]:
        if t["id"] == "tenant-a":
            t["pools"] = ["default", "eu"]
    p.write_text(yaml.safe_dump(doc))
    r = await stack.client.post(f"{stack.admin_url}/admin/tenants/reload", headers=stack.operator_auth())
    assert r.status_code == 200, r.text
    urls = dict(zip(("r0", "r1", "r2"), stack.cluster.urls))
    open_upstream, router = pipeline.open_upstream, stack.components.router
    route = router.route
    written: list[str] = []
    routed: list[str] = []

    def first_fails_after_a_change(session: Any, url: str, *args: Any) -> Any:
        written.append(url)
        if len(written) > 1:
            return open_upstream(session, url, *args)

        async def refused() -> Any:  # while the first attempt fails, the operator reserves the pool it used
            await reserve({"default": {"data_residency": "none"}})
            raise UpstreamFailure("connect", "connection refused (test)", reached=False)
        return refused()

    def route_into_the_reserved_pool(req: Any, ids: Any, *rest: Any) -> Any:
        ids = list(ids)
        if len(routed) < 2:  # the first attempt and the retry: the router picks a replica of pool default
            ids = [i for i in ids if i in ("r0", "r1")]
        choice, ticket = route(req, ids, *rest)
        routed.append(choice.replica_id)
        return choice, ticket

    monkeypatch.setattr(pipeline, "open_upstream", first_fails_after_a_change)
    monkeypatch.setattr(router, "route", route_into_the_reserved_pool)
    r = await stack.client.post("/v1/completions", json=BODY, headers=stack.auth())
    assert routed[:2] in (["r0", "r1"], ["r1", "r0"]) and len(routed) == 3  # the retry chosen in the reserved
    assert routed[2] == "r2"  # pool, then chosen again among the replicas the new decision allows
    assert r.status_code == 200, r.text[:200]
    assert written[1:] == [urls["r2"] + "/v1/completions"]  # before: written to the reserved replica
