"""Review R3-6: one unauthenticated source must not fill the listener's connection cap.

``server.max_connections_per_source`` (off by default) bounds the open
connections from one source IP per listener: one more is answered at once with
a JSON 503 (``too_many_connections``) and closed, before any byte is read;
another source still gets in, and a closed connection frees its place. Both
HTTP parsers; loopback only (127.0.0.1 and 127.0.0.2 are two sources).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.app import build_public_app
from gateway.config import GatewayConfig
from gateway.http_guard import guarded_protocol
from gateway.server import uvicorn_config
from tests.hostile.test_i10_header_limits import (  # noqa: F401 - config_overrides is a fixture
    Listener, _recording, close, config_overrides, head_of_size, read_one_response, read_until_closed,
)
from tests.support.listeners import serving
from tests.support.waiting import wait_for

PARSERS = pytest.mark.parametrize("parser", ["h11", "httptools"])


@pytest.fixture
async def start(stack: Any) -> Any:
    """``await start(parser, "public", max_connections_per_source=N)``: a public listener on 127.0.0.1:0."""
    c = stack.components
    async with serving() as serve:
        async def _start(parser: str, which: str, max_connections_per_source: int | None = None) -> Listener:
            assert which == "public"
            reached: list[str] = []
            app = _recording(build_public_app(c, manage_lifecycle=False), reached)
            addr = await serve(uvicorn_config(app, "127.0.0.1", 0, http=parser, limits=c.config.limits,
                                              max_connections_per_source=max_connections_per_source))
            return Listener(addr, "/healthz", reached)

        yield _start


async def _connect(addr: tuple[str, int], source: str = "127.0.0.1") -> tuple[Any, Any]:
    return await asyncio.open_connection(*addr, local_addr=(source, 0))


@PARSERS
async def test_one_source_is_capped_others_are_not(start, parser):
    lst = await start(parser, "public", max_connections_per_source=3)
    idle = [await _connect(lst.addr) for _ in range(3)]  # send nothing, as in the review
    try:
        reader, writer = await _connect(lst.addr)
        data, closed = await read_until_closed(reader)
        await close(writer)
        assert closed and data.startswith(b"HTTP/1.1 503 "), data
        body = json.loads(data.split(b"\r\n\r\n", 1)[1])
        assert body["error"]["code"] == "too_many_connections"
        assert "3" in body["error"]["message"] and lst.reached == []
        # another source is served while the first is at its cap
        reader, writer = await _connect(lst.addr, "127.0.0.2")
        writer.write(head_of_size(lst.path, 200))
        await writer.drain()
        assert (await read_one_response(reader)).status == 200
        await close(writer)
        # a closed connection frees its place
        await close(idle.pop()[1])

        async def admitted() -> bool:
            r, w = await _connect(lst.addr)
            w.write(head_of_size(lst.path, 200))
            await w.drain()
            try:
                resp = await read_one_response(r)
            except (asyncio.IncompleteReadError, ConnectionError):
                return False
            finally:
                await close(w)
            return resp.status == 200

        await wait_for(admitted, timeout_s=10)
    finally:
        for _, w in idle:
            await close(w)


@PARSERS
async def test_off_by_default(start, parser):
    lst = await start(parser, "public")
    conns = [await _connect(lst.addr) for _ in range(20)]
    try:
        reader, writer = conns[-1]
        writer.write(head_of_size(lst.path, 200))
        await writer.drain()
        assert (await read_one_response(reader)).status == 200
    finally:
        for _, w in conns:
            await close(w)


def test_config_key_reaches_the_protocol() -> None:
    assert GatewayConfig.model_validate({}).server.max_connections_per_source is None
    cfg = GatewayConfig.model_validate({"server": {"max_connections_per_source": 64}})
    assert cfg.server.max_connections_per_source == 64
    with pytest.raises(Exception):
        GatewayConfig.model_validate({"server": {"max_connections_per_source": 0}})
    ucfg = uvicorn_config(lambda *a: None, "127.0.0.1", 0, limits=cfg.limits, max_connections_per_source=64)
    assert ucfg.http.guard_max_connections_per_source == 64
    # each listener's class counts its own connections
    a, b = guarded_protocol("h11", max_connections_per_source=2), guarded_protocol("h11", max_connections_per_source=2)
    assert a.guard_source_counts is not b.guard_source_counts
