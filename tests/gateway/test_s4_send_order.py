"""Issues 14/15: in a burst of requests, an upstream send started by an earlier request goes out
before a later request's pipeline runs (gateway/send_order.py).

The listener stamps each request's scope with the sends started when its head completed; the
proxy counts each send; the pipeline's first step yields while sends were started since the stamp
(bounded), so a body writer queued by an earlier request runs first.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.proxy import make_session, open_upstream
from gateway.send_order import MAX_YIELDS, SCOPE_KEY, SEND_ORDER, SendOrder
from gateway.server import uvicorn_config
from tests.support.listeners import serving


async def test_a_writer_queued_after_the_stamp_runs_before_the_request_work() -> None:
    order = SendOrder()
    scope: dict[str, Any] = {}
    order.stamp(scope)  # request 2's head is complete
    ran: list[str] = []

    async def request_two() -> None:
        await order.wait_turn(scope)
        ran.append("request 2 work")

    task = asyncio.ensure_future(request_two())  # queued before request 1's writer
    order.sending()  # request 1 starts its send ...
    writer = asyncio.ensure_future(asyncio.sleep(0, result=ran.append("writer queued")))
    asyncio.get_running_loop().call_soon(ran.append, "request 1 body written")  # ... whose writer is queued now
    await asyncio.gather(task, writer)
    assert ran.index("request 1 body written") < ran.index("request 2 work")


async def test_no_send_since_the_stamp_means_no_yield() -> None:
    order = SendOrder()
    scope: dict[str, Any] = {}
    order.stamp(scope)
    assert await order.wait_turn(scope) == 0
    assert await order.wait_turn({}) == 0  # no stamp (not from the listener): never waits


async def test_yields_are_bounded_under_a_stream_of_sends() -> None:
    order = SendOrder()
    scope: dict[str, Any] = {}
    order.stamp(scope)
    stop = False

    def keep_sending() -> None:  # a send in every loop step, for ever
        order.sending()
        if not stop:
            asyncio.get_running_loop().call_soon(keep_sending)

    keep_sending()
    try:
        assert await asyncio.wait_for(order.wait_turn(scope), 5) == MAX_YIELDS
    finally:
        stop = True


@pytest.mark.parametrize("parser", ["h11", "httptools"])
async def test_the_listener_stamps_each_request(parser: str) -> None:
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope.get(SCOPE_KEY))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async with serving() as serve:
        host, port = await serve(uvicorn_config(app, "127.0.0.1", 0, http=parser))
        before = SEND_ORDER.sends
        async with aiohttp.ClientSession() as s:
            for _ in range(2):  # the second on the same keep-alive connection
                async with s.get(f"http://{host}:{port}/x") as r:
                    assert r.status == 204
    assert len(seen) == 2 and all(isinstance(v, int) and v >= before for v in seen)


async def test_open_upstream_counts_a_send() -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="{}", content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    session = make_session(4, 2.0, 10.0)
    try:
        before = SEND_ORDER.sends
        up = await open_upstream(session, f"http://127.0.0.1:{port}/v1/completions", {"a": 1}, {}, 5.0)
        up.close()
        assert SEND_ORDER.sends == before + 1
    finally:
        await session.close()
        await runner.cleanup()
