"""Issue 12, finding 6: no slot leaks, whatever way a request ends.

Public report: a request that errored never released its concurrency slot.
A tenant with ``max_concurrency: 4`` sends 50 requests at once to replicas
that hold each one (0.3 s here: the behaviour matters, not the number): at
most 4 are ever in flight at a replica. Then requests end every way — bad
JSON, unknown model, upstream 500, client gone mid-stream, policy deny,
timeout, client gone before the answer, client gone as the answer starts,
the answer's first ``send`` failing (ASGI 2.4), a gateway error after
routing — and afterwards the tenant's concurrency, the router's load
tracker and the replicas are all back to zero, every request wrote exactly
one audit record, and 4 concurrent requests are all admitted (the replica
sees all 4 at once).

The replicas are simulated replicas (``sim.replica``) behind one middleware
that counts requests in flight (and the peak) and acts on a marker word that
starts the prompt: ``hold`` (wait, then answer), ``gate`` (wait until 4 are
in flight, then answer), ``fail500``, ``stallfirst`` (no byte until the
gateway hangs up), ``stallmid`` (one SSE event, then nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from sim.replica import ReplicaConfig, create_app, run_app_on

sys.path.insert(0, os.path.dirname(__file__))
from i12_asgi import AsgiClient  # noqa: E402

TD = "demo.prefixgate.test"
LONG = " ".join(f"w{i}" for i in range(40))
CONCURRENCY = 4
HOLD_S = 0.3
TENANT = "tenant-a"


@dataclass
class Counted:
    """Replicas ``r0``, ``r1`` (pool default) that count requests in flight."""

    urls: list[str] = field(default_factory=list)
    runners: list[web.AppRunner] = field(default_factory=list)
    in_flight: int = 0
    peak: int = 0
    gate: asyncio.Event = field(default_factory=asyncio.Event)

    def reset_peak(self) -> None:
        self.peak = self.in_flight
        self.gate = asyncio.Event()


def _middleware(cnt: Counted) -> Any:
    @web.middleware
    async def count(request: web.Request, handler: Any) -> web.StreamResponse:
        if not (request.method == "POST" and request.path.startswith("/v1/")):
            return await handler(request)
        body = await request.json()  # cached by aiohttp: the simulator reads it again
        mode = str(body.get("prompt", "")).split(" ", 1)[0]
        cnt.in_flight += 1
        cnt.peak = max(cnt.peak, cnt.in_flight)
        try:
            if mode == "hold":
                await asyncio.sleep(HOLD_S)
            elif mode == "gate":
                if cnt.in_flight >= CONCURRENCY:
                    cnt.gate.set()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(cnt.gate.wait(), 3.0)
            elif mode == "fail500":
                return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=500)
            elif mode == "stallfirst":
                await asyncio.sleep(30)  # cancelled when the gateway hangs up (handler_cancellation)
            elif mode == "stallmid":
                resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
                await resp.prepare(request)
                await resp.write(b'data: {"id":"c","object":"text_completion","created":0,"model":"sim-model",'
                                 b'"choices":[{"index":0,"text":" a","finish_reason":null}]}\n\n')
                await asyncio.sleep(30)
                return resp
            return await handler(request)
        finally:
            cnt.in_flight -= 1

    return count


@pytest.fixture
async def counted(replica_cfg: ReplicaConfig) -> AsyncIterator[Counted]:
    cnt = Counted()
    try:
        for i in range(2):
            app = create_app(dataclasses.replace(replica_cfg, replica_id=f"counted-{i}"))
            app.middlewares.append(_middleware(cnt))
            runner, url = await run_app_on(app, "127.0.0.1", 0)
            cnt.runners.append(runner)
            cnt.urls.append(url)
        yield cnt
    finally:
        for r in cnt.runners:
            await r.cleanup()


@pytest.fixture
def n_replicas() -> int:
    return 1  # the stack's own cluster is unused: the gateway talks to ``counted``


@pytest.fixture
def config_overrides(counted: Counted, stable_secret: str, tmp_path: Path) -> dict[str, Any]:
    return {
        "models": ["sim-model", "other-model"],  # other-model is served but tenant-a is not entitled to it
        "replicas": [{"id": f"r{i}", "url": u, "pool": "default"} for i, u in enumerate(counted.urls)],
        "upstream": {"connect_timeout_s": 0.5, "first_byte_timeout_s": 0.5, "read_timeout_s": 0.5,
                     "total_timeout_s": 2.0, "max_attempts": 2},
        # probe timeout: tests/faults/conftest.py (a short one marked replicas down under load)
        "health": {"interval_s": 0.2, "timeout_s": 2.0, "unhealthy_after": 1, "healthy_after": 1,
                   "breaker_failures": 100},  # this test is about slots, not the breaker
        # no queue: a request beyond the concurrency is refused at once (issue 17: a queued one
        # would wait for a slot, holding none; tests/gateway/test_s2_flow_slots.py)
        "flow": {"tenant_max_queued_requests": 0},
        "tenancy": {
            "master_secret_file": stable_secret,
            "master_secret_env": None,
            "state_file": str(tmp_path / "keystate.json"),
            "operators": [f"spiffe://{TD}/ops/admin"],
            "tenants": [
                {"id": TENANT, "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"],
                 "pools": ["default"], "max_output_tokens": 64, "max_concurrency": CONCURRENCY},
            ],
        },
    }


def body(mode: str, **kw: Any) -> dict[str, Any]:
    return {"model": "sim-model", "prompt": f"{mode} {LONG}", "max_tokens": 8, **kw}


async def post(stack: Any, payload: dict[str, Any] | None = None, **kw: Any) -> httpx.Response:
    return await stack.client.post("/v1/completions", json=payload, headers=stack.auth(), **kw)


async def test_no_slot_leaks_whatever_way_requests_end(
    stack: Any, counted: Counted, until: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = stack.components
    audit = c.audit
    sent = 0

    def all_settled() -> bool:
        loads = [c.router.loads.snapshot(r) for r in ("r0", "r1")]
        return (c.limiter.in_flight(TENANT) == 0 and counted.in_flight == 0
                and all(x.running_requests == 0 and x.tokens == 0 for x in loads))

    # 1. 50 at once: never more than 4 at the replicas; the rest refused with 429 concurrency_limited
    rs = await asyncio.gather(*(post(stack, body("hold")) for _ in range(50)))
    sent += 50
    codes = [r.status_code for r in rs]
    assert counted.peak <= CONCURRENCY, f"peak in flight at the replicas: {counted.peak}"
    assert codes.count(200) >= 1 and set(codes) <= {200, 429}, codes
    assert all(r.json()["error"]["code"] == "concurrency_limited" for r in rs if r.status_code == 429)
    assert await until(all_settled)

    # 2. requests ending every way
    r = await stack.client.post("/v1/completions", content=b'{"model": "sim-model", "prompt": ',
                                headers={**stack.auth(), "Content-Type": "application/json"})
    assert r.status_code == 400  # bad JSON
    r = await post(stack, body("hold", model="no-such-model"))
    assert r.status_code == 404  # unknown model
    r = await post(stack, body("fail500"))
    assert r.status_code == 500  # upstream 500: passed on, not retried (R7-2)
    r = await post(stack, body("hold", model="other-model"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"  # not entitled (R3-7)
    r = await post(stack, body("stallfirst"))
    assert r.status_code == 504  # timeout
    sent += 5
    async with httpx.AsyncClient(base_url=stack.url, timeout=5) as client:  # client gone mid-stream
        async with client.stream("POST", "/v1/completions", json=body("stallmid", stream=True),
                                 headers=stack.auth()) as resp:
            assert resp.status_code == 200
            async for _ in resp.aiter_bytes():
                break
    async with httpx.AsyncClient(base_url=stack.url, timeout=0.2) as client:  # client gone before the answer
        with pytest.raises(httpx.ReadTimeout):
            await client.post("/v1/completions", json=body("stallfirst"), headers=stack.auth())
    sent += 2
    asgi = AsgiClient(c, stack.auth()["Authorization"])
    await asgi.call(body("stallmid", stream=True), leave="after_upstream")  # gone as the answer starts
    await asgi.call(body("hold", stream=True), leave="never", spec="2.4", fail_start=True)  # first send fails
    sent += 2

    def boom(*args: Any) -> None:  # the trace headers of the upstream call
        raise RuntimeError("a bug after routing")

    monkeypatch.setattr(c.audit, "inject_trace_headers", boom)
    r = await post(stack, body("hold"))
    assert r.status_code == 500  # a gateway error after the load ticket was taken
    monkeypatch.undo()
    sent += 1

    # 3. everything given back: tenant slots, the router's load tracker, the replicas
    assert await until(all_settled), (
        f"in flight: tenant {c.limiter.in_flight(TENANT)}, replicas {counted.in_flight}, "
        f"loads {[c.router.loads.snapshot(x) for x in ('r0', 'r1')]}")
    assert await until(lambda: len(audit.records) == sent), \
        f"{len(audit.records)} audit records for {sent} requests"

    # 4. 4 concurrent requests are all admitted and all 4 reach the replicas at the same time
    counted.reset_peak()
    rs = await asyncio.gather(*(post(stack, body("gate")) for _ in range(CONCURRENCY)))
    sent += CONCURRENCY
    assert [r.status_code for r in rs] == [200] * CONCURRENCY, [r.text for r in rs if r.status_code != 200]
    assert counted.peak == CONCURRENCY
    assert await until(all_settled)
    assert await until(lambda: len(audit.records) == sent)
    assert len(audit.records) == sent  # exactly one record per request, none twice
