"""A plain answer already whole after its first chunk is read without waiting
(UpstreamStream.body_received); one still arriving is read to its end as before."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from gateway.proxy import make_session, open_upstream
from sim.procs import free_port

WHOLE = {"id": "x", "usage": {"prompt_tokens": 3, "completion_tokens": 1}}


async def _whole(request: web.Request) -> web.Response:
    await request.read()
    return web.json_response(WHOLE)


async def _in_two_parts(request: web.Request) -> web.StreamResponse:
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": "application/json"})
    await resp.prepare(request)
    text = json.dumps(WHOLE).encode()
    await resp.write(text[:5])
    await asyncio.sleep(0.2)  # the second part comes later: the gateway must wait for it
    await resp.write(text[5:])
    await resp.write_eof()
    return resp


@pytest.fixture
async def replica() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/whole", _whole)
    app.router.add_post("/parts", _in_two_parts)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    yield f"http://127.0.0.1:{port}"
    await runner.cleanup()


async def test_whole_answer_is_received_with_its_first_chunk(replica: str) -> None:
    session = make_session(4, 5.0, 5.0)
    try:
        up = await open_upstream(session, replica + "/whole", {"a": 1}, {}, 5.0)
        assert up.body_received()
        assert json.loads(up.first_chunk + await up.read_rest()) == WHOLE
        up.close()
    finally:
        await session.close()


async def test_answer_in_parts_is_not_taken_as_whole_and_is_read_to_its_end(replica: str) -> None:
    session = make_session(4, 5.0, 5.0)
    try:
        up = await open_upstream(session, replica + "/parts", {"a": 1}, {}, 5.0)
        assert not up.body_received()
        assert json.loads(up.first_chunk + await up.read_rest()) == WHOLE
        assert up.body_received()
        up.close()
    finally:
        await session.close()
