"""An OPA stand-in over HTTP for policy-push tests whose OPA must hold or slow an answer on an event.

(tests/support/opa_server.py is the faithful stand-in, with an embedded engine; this one only records
what it is sent, so a test can hold a push, a decision or the health answer until it says so.)

Endpoints: ``PUT /v1/policies/{id}`` (kept in ``modules``, answer ``{}``), ``DELETE /v1/policies/{id}``
(kept in ``deletes``; 404 ``resource_not_found`` for a module it lacks), ``PUT /v1/data/{path}`` (kept in
``data``, 204), ``GET /health`` (200 ``{}``), ``POST /v1/data/{path}`` (a decision: ``allow``). A subclass
holds an answer by overriding :meth:`StandInOpa.after_push`, :meth:`before_health` or :meth:`before_decide`
with :meth:`until` (an event, or ``gone``, set when the server stops: every held handler then returns).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

__all__ = ["StandInOpa", "serving_opa"]


class StandInOpa:
    """Records pushes; answers health and decisions at once unless a subclass's hook holds them."""

    def __init__(self) -> None:
        self.modules: dict[str, str] = {}
        self.data: dict[str, Any] = {}
        self.deletes: list[str] = []
        self.gone = asyncio.Event()  # set when the server stops
        self.url = ""

    async def until(self, event: asyncio.Event) -> None:
        """Wait for ``event`` or for the server's stop, whichever comes first."""
        waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(self.gone.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def after_push(self) -> None:
        """Runs after a policy or data push was applied, before its answer (default: nothing)."""

    async def before_health(self) -> None:
        """Runs before ``/health`` answers (default: nothing)."""

    async def before_decide(self) -> None:
        """Runs before a decision answers (default: nothing)."""

    async def put_policy(self, request: web.Request) -> web.Response:
        self.modules[request.match_info["id"]] = await request.text()
        await self.after_push()
        return web.json_response({})

    async def delete_policy(self, request: web.Request) -> web.Response:
        self.deletes.append(request.match_info["id"])
        if self.modules.pop(request.match_info["id"], None) is None:
            return web.json_response({"code": "resource_not_found", "message": "no such policy"}, status=404)
        return web.json_response({})

    async def put_data(self, request: web.Request) -> web.Response:
        self.data[request.match_info["path"]] = await request.json()
        await self.after_push()
        return web.Response(status=204)

    async def health(self, request: web.Request) -> web.Response:
        await self.before_health()
        return web.json_response({})

    async def decide(self, request: web.Request) -> web.Response:
        await self.before_decide()
        return web.json_response({"result": {"allow": True}})

    def app(self) -> web.Application:
        """The aiohttp application of these endpoints."""
        app = web.Application()
        app.router.add_put("/v1/policies/{id:.*}", self.put_policy)
        app.router.add_delete("/v1/policies/{id:.*}", self.delete_policy)
        app.router.add_put("/v1/data/{path:.*}", self.put_data)
        app.router.add_get("/health", self.health)
        app.router.add_post("/v1/data/{path:.*}", self.decide)
        return app


@asynccontextmanager
async def serving_opa(stand_in: StandInOpa) -> AsyncIterator[StandInOpa]:
    """Serve ``stand_in`` on a free loopback port (``stand_in.url`` set); at the end set ``gone`` and stop."""
    runner = web.AppRunner(stand_in.app())
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        stand_in.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        yield stand_in
    finally:
        stand_in.gone.set()
        await runner.cleanup()
