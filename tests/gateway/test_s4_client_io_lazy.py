"""Session 4 (issue 14): unless_client_leaves starts its disconnect watcher only once the work
suspends; work that finishes at once never listens on the client (no watcher task)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.client_io import ClientGone, unless_client_leaves


class _Client:
    def __init__(self) -> None:
        self.left = asyncio.Event()
        self.receives = 0

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        await self.left.wait()
        return {"type": "http.disconnect"}


async def _now(value: str) -> str:
    return value


async def test_work_that_never_suspends_starts_no_watcher() -> None:
    client = _Client()
    created: list[Any] = []
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()
    loop.set_task_factory(lambda lp, coro, **kw: created.append(coro) or asyncio.Task(coro, loop=lp, **kw))
    try:
        assert await unless_client_leaves(client, _now("answer")) == "answer"  # type: ignore[arg-type]
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    finally:
        loop.set_task_factory(factory)
    assert created == [] and client.receives == 0


async def test_suspended_work_is_still_cancelled_when_the_client_leaves() -> None:
    client = _Client()
    reached = asyncio.Event()

    async def slow() -> str:
        reached.set()
        await asyncio.sleep(30)
        return "never"

    async def leave_later() -> None:
        await reached.wait()
        await asyncio.sleep(0)
        client.left.set()

    leaver = asyncio.ensure_future(leave_later())
    with pytest.raises(ClientGone):
        await asyncio.wait_for(unless_client_leaves(client, slow()), 5)  # type: ignore[arg-type]
    await leaver
    assert client.receives == 1


async def test_work_that_ends_before_the_watch_delay_starts_no_watcher() -> None:
    client = _Client()

    async def short() -> str:
        await asyncio.sleep(0)  # suspends, but ends long before WATCH_AFTER_S
        await asyncio.sleep(0)
        return "answer"

    assert await unless_client_leaves(client, short()) == "answer"  # type: ignore[arg-type]
    await asyncio.sleep(0.01)
    assert client.receives == 0
