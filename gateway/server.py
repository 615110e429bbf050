"""Run the public and admin listeners in one event loop with uvicorn.

uvicorn's proxy-header rewriting stays off (``proxy_headers=False``): the
client address used for source limits and for trusting a forwarded client
certificate is the socket peer, never an ``X-Forwarded-For`` value.
"""

from __future__ import annotations

import asyncio

import uvicorn

from gateway.app import build_admin_app, build_public_app
from gateway.components import Components
from gateway.config import GatewayConfig

__all__ = ["serve", "uvicorn_config"]


def uvicorn_config(app: object, host: str, port: int, **kw: object) -> uvicorn.Config:
    """uvicorn settings shared by both listeners (no proxy headers, no server header)."""
    return uvicorn.Config(
        app, host=host, port=port, proxy_headers=False, server_header=False, access_log=False,
        lifespan="off", timeout_graceful_shutdown=30, log_level="warning", **kw,  # type: ignore[arg-type]
    )


async def serve(cfg: GatewayConfig, *, config_path: str | None = None) -> None:
    """Build components, start them, serve both listeners until a signal, then drain and stop."""
    c = Components(cfg)
    c.config_path = config_path  # type: ignore[attr-defined]
    await c.start()
    servers = [uvicorn.Server(uvicorn_config(build_public_app(c, manage_lifecycle=False),
                                             cfg.listen.host, cfg.listen.port))]
    if cfg.admin is not None:
        servers.append(uvicorn.Server(uvicorn_config(build_admin_app(c), cfg.admin.host, cfg.admin.port)))
    tasks = [asyncio.ensure_future(s.serve()) for s in servers]
    try:
        # A signal stops whichever server holds the handler; then stop the others too.
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await c.stop()
