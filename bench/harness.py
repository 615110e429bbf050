"""Pieces every benchmark uses: serving a gateway in a bench's child process, and
best-of-N CPU timing of an isolated stage."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.build import Gateway
    from gateway.server import GatewayServer

__all__ = ["best_cpu_us", "serve_public", "serve_until_sigterm"]


async def serve_public(gateway: Gateway, *, freeze: bool = False) -> tuple[GatewayServer, asyncio.Task[None], int]:
    """Serve ``gateway``'s public app (lifecycle left to the caller) on 127.0.0.1, a free port.

    ``freeze``: freeze the startup objects out of the cyclic GC first, as
    :func:`gateway.server.serve` does. Returns ``(server, serving task, port)`` once it
    listens; raises RuntimeError when the server ends before it listens."""
    from gateway.app import build_public_app
    from gateway.server import GatewayServer, freeze_startup_objects, uvicorn_config

    if freeze:
        freeze_startup_objects()
    server = GatewayServer(uvicorn_config(build_public_app(gateway, manage_lifecycle=False), "127.0.0.1", 0))
    task = asyncio.ensure_future(server.serve())
    while not server.started:
        if task.done():
            raise RuntimeError("gateway failed to start")
        await asyncio.sleep(0.01)
    return server, task, server.servers[0].sockets[0].getsockname()[1]


async def serve_until_sigterm(server: GatewayServer, task: asyncio.Task[None]) -> None:
    """Wait for SIGTERM, then stop ``server`` and wait for its serving ``task`` to end."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    server.should_exit = True
    await task


def best_cpu_us(fn: Callable[[], None], reps: int, n: int) -> float:
    """Process CPU microseconds per operation of the fastest of ``reps`` calls of ``fn``,
    each doing ``n`` operations (the minimum is the run least disturbed by other jobs)."""
    best: int | None = None
    for _ in range(reps):
        t0 = time.process_time_ns()
        fn()
        dt = time.process_time_ns() - t0
        best = dt if best is None or dt < best else best
    return (best or 0) / n / 1000.0
