"""Gateway listeners on loopback for the hostile-client tests: start a
:class:`gateway.server.GatewayServer` on a uvicorn config (port 0) and stop every one at the end.

``async with serving() as serve: addr = await serve(uvicorn_config(...))``
"""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from gateway.server import GatewayServer
from tests.support.waiting import wait_for

__all__ = ["serving"]


@contextlib.asynccontextmanager
async def serving() -> AsyncIterator[Callable[[Any], Awaitable[tuple[str, int]]]]:
    """Yield ``serve(config)``: start a :class:`GatewayServer` on ``config`` (a uvicorn ``Config``,
    e.g. from :func:`gateway.server.uvicorn_config`), wait (at most 10 s) until it listens and return
    its (host, port). Raises RuntimeError when it stops before listening, AssertionError when it
    does neither within 10 s. On exit every
    server started is told to exit and its serving task awaited (exceptions swallowed)."""
    servers: list[GatewayServer] = []
    tasks: list[asyncio.Task[Any]] = []

    async def serve(config: Any) -> tuple[str, int]:
        server = GatewayServer(config)
        servers.append(server)
        task = asyncio.ensure_future(server.serve())
        tasks.append(task)
        await wait_for(lambda: server.started or task.done(), timeout_s=10, what="listener started", step_s=0.01)
        if not server.started:
            raise RuntimeError("listener failed to start")
        host, port = server.servers[0].sockets[0].getsockname()[:2]
        return host, port

    try:
        yield serve
    finally:
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
