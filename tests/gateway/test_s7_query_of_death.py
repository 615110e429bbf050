"""Review R7-2: one tenant's "query of death" must not open the shared circuit breakers.

Fake replicas (aiohttp, in this file) answer a normal completion, or ``poison_status`` to any
request whose prompt holds ``POISON`` (as an engine's internal error on one input), or a stream
that stops after its first chunk until released (``HOLD``). Before the fix every 500 counted
against the replica and was retried on the other one, so tenant-a's poison opened both circuits
and tenant-b got 503 ``no_replica``; and a half-open probe's verdict waited for the end of its
stream, so one held stream kept the replica out of rotation.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
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
    poison_status: int = 500
    healthy: bool = True
    poison_hits: int = 0
    hold: asyncio.Event = field(default_factory=asyncio.Event)
    fail_all: bool = False  # every completion answers poison_status (the gateway's own probe too)


def _chunk(text: str) -> bytes:
    obj = {"id": "c", "object": "text_completion", "created": 0, "model": "sim-model",
           "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


def _app(fake: Fake) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = str(body.get("prompt", ""))
        if "POISON" in prompt or fake.fail_all:
            fake.poison_hits += "POISON" in prompt
            return web.json_response({"error": {"message": "engine crashed on this input (internal trace)",
                                                "type": "server_error"}}, status=fake.poison_status)
        if not body.get("stream"):
            return web.json_response(PLAIN_ANSWER)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(_chunk("first"))
        if "HOLD" in prompt:
            await fake.hold.wait()
        await resp.write(_chunk("rest"))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    return base_app(fake, completions)


@pytest.fixture
async def fakes() -> AsyncIterator[list[Fake]]:
    async with serving([Fake() for _ in range(3)], _app) as out:
        yield out
        for f in out:
            f.hold.set()


@pytest.fixture
def config_overrides(fakes: list[Fake]) -> dict[str, Any]:
    return {
        "replicas": [{"id": "f0", "url": fakes[0].url, "pool": "default"},
                     {"id": "f1", "url": fakes[1].url, "pool": "default"},
                     {"id": "f2", "url": fakes[2].url, "pool": "eu", "labels": {"data_residency": "eu"}}],
        "health": {"interval_s": 0.2, "timeout_s": 2.0, "unhealthy_after": 1, "healthy_after": 1,
                   "breaker_failures": 3, "breaker_cooldown_s": 0.5},
    }




async def test_one_tenants_500s_neither_open_the_circuits_nor_are_retried(stack: Any, fakes: list[Fake]) -> None:
    rs = stack.components.replica_set
    await wait_for(lambda: {"f0", "f1"} <= set(rs.routable_ids()), what="fake replicas healthy")
    for i in range(8):  # > breaker_failures x replicas
        r = await stack.client.post("/v1/completions", json=completion(f"POISON {i}"), headers=stack.auth("tenant-a/app"))
        assert r.status_code == 500, r.text  # before R7-2: 502 after a retry on the other replica
        err = r.json()["error"]
        assert err["code"] == "upstream_rejected" and "trace" not in err["message"]  # no engine text
    assert fakes[0].poison_hits + fakes[1].poison_hits == 8  # one attempt each: not retried
    assert {"f0", "f1"} <= set(rs.routable_ids())
    assert rs.state("f0").circuit is CircuitState.CLOSED and rs.state("f1").circuit is CircuitState.CLOSED
    r = await stack.client.post("/v1/completions", json=completion("hello"), headers=stack.auth("tenant-b/app"))
    assert r.status_code == 200, r.text  # before R7-2: 503 no_replica


@pytest.mark.parametrize("status", [502, 503])
async def test_gateway_failures_still_open_the_circuits(stack: Any, fakes: list[Fake], status: int) -> None:
    """Gateway failures of two tenants open the shared circuits (session 8, R8-2: one tenant's
    alone open only its own pairs, tests/gateway/test_s8_breaker_e2e.py) when the replicas fail the
    gateway's own request too (session 10, S9-L4: input-specific failures stay with the tenants,
    tests/security/test_s10_breaker_collusion.py)."""
    rs = stack.components.replica_set
    await wait_for(lambda: {"f0", "f1"} <= set(rs.routable_ids()), what="fake replicas healthy")
    fakes[0].poison_status = fakes[1].poison_status = status
    fakes[0].fail_all = fakes[1].fail_all = True
    for i in range(2):
        for tenant in ("tenant-a/app", "tenant-b/app"):
            r = await stack.client.post("/v1/completions", json=completion(f"POISON {i}"), headers=stack.auth(tenant))
            assert r.status_code in (502, 503), r.text
    assert fakes[0].poison_hits + fakes[1].poison_hits == 8  # each retried on the other replica
    await wait_for(lambda: not {"f0", "f1"} & set(rs.routable_ids()), what="both shared circuits open")
    r = await stack.client.post("/v1/completions", json=completion("hello"), headers=stack.auth("tenant-b/app"))
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_replica"


async def test_half_open_probe_closes_the_circuit_at_its_first_byte(stack: Any, fakes: list[Fake]) -> None:
    rs = stack.components.replica_set
    fakes[1].healthy = False  # one replica in the pool: f0
    await wait_for(lambda: rs.routable_ids(["default"]) == ["f0"], what="f1 down, f0 up")
    fakes[0].poison_status, fakes[0].fail_all = 503, True  # a real fault: the gateway's own probe fails too (S9-L4)
    for i in range(2):  # two tenants' failures (R8-2): the shared circuit opens
        for tenant in ("tenant-a/app", "tenant-b/app"):
            await stack.client.post("/v1/completions", json=completion(f"POISON {i}"), headers=stack.auth(tenant))
    await wait_for(lambda: rs.state("f0").circuit is not CircuitState.CLOSED, what="f0's shared circuit open")
    fakes[0].fail_all = False
    await wait_for(lambda: rs.state("f0").circuit is CircuitState.HALF_OPEN, what="cool-down over")
    async with stack.client.stream("POST", "/v1/completions", headers=stack.auth("tenant-a/app"),
                                   json=completion("HOLD", stream=True)) as held:
        assert held.status_code == 200
        chunks = held.aiter_bytes()
        first = await chunks.__anext__()  # the probe's first byte is here; its stream is held open by the replica
        assert rs.state("f0").circuit is CircuitState.CLOSED  # before R7-2: half-open until the stream ends
        r = await stack.client.post("/v1/completions", json=completion("hello"), headers=stack.auth("tenant-b/app"))
        assert r.status_code == 200, r.text  # before R7-2: 503 no_replica while the probe streams
        fakes[0].hold.set()
        rest = b"".join([c async for c in chunks])
    assert b"first" in first + rest and b"[DONE]" in rest
