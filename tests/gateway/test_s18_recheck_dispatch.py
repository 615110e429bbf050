"""Session 18, helper recheck (R17-5 (c), flow control off): the policy generation is compared right before every
attempt's upstream write, not only when a request leaves the flow queue. A registry reload acknowledged while a
request is still being admitted (its body read: the tenant was resolved before) or while its first attempt fails
holds for it: it is authorized again (gateway/pep_recheck.py) and refused as a fresh request would be. Before,
both were served on the old facts (the generation was read after the body, and compared only at a queue release)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest
import yaml

import gateway.pipeline as pipeline
from gateway.proxy import UpstreamFailure

BODY = {"model": "sim-model", "prompt": "hello there", "max_tokens": 4}


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"flow": {"enabled": False}}


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
