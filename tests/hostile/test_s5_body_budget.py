"""Review R5-3: request-body bytes being read are bounded per process and per source address.

One tenant pinned ~250 MiB with 250 almost-complete 1 MiB bodies (408 after 10 s, nothing
charged). :class:`gateway.body_budget.BodyBudget` (``limits.max_buffered_body_bytes`` and
``..._per_source``) bounds what the app holds; a part past it answers 503
``body_budget_exhausted`` (``Retry-After``, ``Connection: close``) and is not drained.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.body_budget import BodyBudget
from gateway.body_guard import REFUSED_SCOPE_KEY
from gateway.config_http import LimitsConfig
from gateway.errors import GatewayError
from gateway.framing import FramingGuard
from tests.hostile.test_i10_framing_guard import Fake
from tests.hostile.test_i10_http_framing import _parse_responses
from tests.support.waiting import wait_for

KiB = 1024


def test_budget_take_and_give():
    b = BodyBudget(10, 6)
    assert b.take("a", 6) and not b.take("a", 1)  # a's share is full
    assert b.take("b", 4) and not b.take("b", 1)  # the total is full
    b.give("a", 6)
    assert b.held == 4 and b.held_by("a") == 0 and b.take("b", 2)
    b.give("b", 100)  # never below zero
    assert b.held == 0 and b.held_by("b") == 0
    with pytest.raises(ValueError):
        BodyBudget(10, 11)


def test_limits_relation_is_checked():
    with pytest.raises(ValueError):
        LimitsConfig(max_body_bytes=1 << 20, max_buffered_body_bytes_per_tenant=(1 << 20) - 1)
    with pytest.raises(ValueError):
        LimitsConfig(max_buffered_body_bytes=1 << 20, max_buffered_body_bytes_per_tenant=2 << 20)
    LimitsConfig()  # the defaults fit


def scope(source: str = "10.0.0.1") -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/x", "client": (source, 1234),
            "headers": [(b"transfer-encoding", b"chunked")]}


async def reading_app(scope: Any, receive: Any, send: Any) -> None:
    """Reads the whole body, then answers 200 (a GatewayError from receive is answered as such)."""
    try:
        while True:
            msg = await receive()
            if msg["type"] != "http.request" or not msg.get("more_body"):
                break
    except GatewayError as err:
        await err.response()(scope, receive, send)
        return
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def test_part_past_the_source_share_answers_503_not_drained():
    budget = BodyBudget(64 * KiB, 8 * KiB)
    guard = FramingGuard(reading_app, max_drain_bytes=1 << 20, drain_timeout_s=10, budget=budget)
    fake = Fake([b"x" * 4 * KiB] * 10)
    await guard(scope(), fake.receive, fake.send)
    start = fake.start()
    assert start["status"] == 503
    headers = {bytes(k).lower(): bytes(v) for k, v in start["headers"]}
    assert headers[b"retry-after"] == b"10" and headers[b"connection"] == b"close"
    assert json.loads(fake.sent[1]["body"])["error"]["code"] == "body_budget_exhausted"
    assert fake.receives == 3  # the third 4 KiB part passed 8 KiB: refused, nothing drained after it
    assert budget.held == 0  # all given back when the request ended


async def test_one_source_cannot_take_another_sources_room():
    """Requests with no tenant named in the scope (the pipeline names it before reading) share by source."""
    budget = BodyBudget(64 * KiB, 8 * KiB)
    guard = FramingGuard(reading_app, max_drain_bytes=1 << 20, drain_timeout_s=10, budget=budget)
    stuck = asyncio.Event()

    async def hold_receive() -> dict[str, Any]:  # 8 KiB then a body that never completes
        if budget.held_by("source:10.0.0.1") < 8 * KiB:
            return {"type": "http.request", "body": b"x" * 4 * KiB, "more_body": True}
        stuck.set()
        await asyncio.Event().wait()
        return {}

    held = Fake()
    task = asyncio.ensure_future(guard(scope("10.0.0.1"), hold_receive, held.send))
    await asyncio.wait_for(stuck.wait(), 5)
    other = Fake([b"y" * 4 * KiB, b"y" * 4 * KiB])
    await guard(scope("10.0.0.2"), other.receive, other.send)
    assert other.start()["status"] == 200
    assert budget.held == 8 * KiB  # the stuck body's parts; the finished one gave its own back
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert budget.held == 0


async def test_complete_body_gives_its_bytes_back_while_the_app_runs():
    budget = BodyBudget(64 * KiB, 16 * KiB)
    seen: list[int] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive()).get("more_body"):
            pass
        seen.append(budget.held)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    fake = Fake([b"x" * KiB] * 3)
    await FramingGuard(app, max_drain_bytes=1 << 20, drain_timeout_s=10, budget=budget)(scope(), fake.receive, fake.send)
    assert seen == [0]


async def test_protocol_refusal_reaches_the_app_as_its_code():
    sc = scope()
    sc[REFUSED_SCOPE_KEY] = "body_too_fragmented"
    fake = Fake([])  # receive: http.disconnect (the protocol closed the connection)
    await FramingGuard(reading_app, max_drain_bytes=1 << 20, drain_timeout_s=10)(sc, fake.receive, fake.send)
    assert fake.start()["status"] == 400
    assert json.loads(fake.sent[1]["body"])["error"]["code"] == "body_too_fragmented"


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"limits": {"max_body_bytes": 64 * KiB, "max_buffered_body_bytes": 1 << 20,
                       "max_buffered_body_bytes_per_tenant": 128 * KiB}}


class HeldBodies:
    """Connections of tenant-a holding 64 KiB bodies one byte short (the budget keeps their parts)."""

    def __init__(self, stack: Any) -> None:
        self.host, port = stack.url.removeprefix("http://").split(":")
        self.port = int(port)
        self.head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway.test\r\n"
                     f"Authorization: Bearer {stack.token()}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: {64 * KiB}\r\n\r\n").encode()
        self.budget = stack.components.body_budget
        self.conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def send(self) -> asyncio.StreamReader:
        """Open one more connection and send all but the last body byte; its reader."""
        reader, writer = await asyncio.open_connection(self.host, self.port)
        self.conns.append((reader, writer))
        writer.write(self.head + b"x" * (64 * KiB - 1))
        await writer.drain()
        return reader

    async def hold(self, n: int) -> None:
        """:meth:`send` ``n`` bodies, each waited for until the budget holds its parts."""
        for _ in range(n):
            before = self.budget.held
            await self.send()
            await wait_for(lambda: self.budget.held >= before + 64 * KiB - 1, timeout_s=10, what="body held")

    async def close(self) -> None:
        """Close every connection and wait until the budget is given back."""
        for _, writer in self.conns:
            writer.close()
        await wait_for(lambda: self.budget.held == 0, timeout_s=15, what="budget given back")


async def test_almost_complete_bodies_from_one_source_hold_at_most_its_share(stack):
    """R5-3 end to end: authenticated bodies that stop one byte short; the third from the same
    source passes its 128 KiB share and answers 503 at once (not 408 after the body timeout)."""
    held = HeldBodies(stack)
    try:
        await held.hold(2)
        reader = await held.send()
        async with asyncio.timeout(5):  # well before body_read_timeout_s (10 s)
            raw = await reader.read(65536)
        resp = _parse_responses(raw)[0]
        assert resp.status == 503 and json.loads(resp.body)["error"]["code"] == "body_budget_exhausted"
        assert resp.headers["retry-after"] == ["10"]
        assert held.budget.held <= 128 * KiB
    finally:
        await held.close()


async def test_a_tenants_held_bodies_do_not_refuse_another_tenant_at_the_same_address(stack):
    """R5b-1 (second review pass): the share is per tenant, not per source address. tenant-a fills
    its 128 KiB share from 127.0.0.1 with bodies one byte short; tenant-b, from the same
    address (as behind NAT or a proxy), is still served; tenant-a's next body is refused."""
    held = HeldBodies(stack)
    chat = {"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": "x " * 2000}]}
    try:
        await held.hold(2)
        assert held.budget.held_by("tenant:tenant-a") >= 2 * (64 * KiB - 1)
        r = await stack.client.post("/v1/chat/completions", headers=stack.auth("tenant-b/app"), json=chat)
        assert r.status_code == 200, r.text
        r = await stack.client.post("/v1/chat/completions", headers=stack.auth("tenant-a/app"), json=chat)
        assert r.status_code == 503 and r.json()["error"]["code"] == "body_budget_exhausted"
    finally:
        await held.close()
