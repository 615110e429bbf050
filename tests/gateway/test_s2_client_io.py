"""unless_client_leaves runs the work in the calling task with one watcher task
(was: the work in its own task, a watcher task and asyncio.wait): the same answers
for every way the race can end, and no cancellation left behind on the caller."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.client_io import ClientGone, unless_client_leaves


class _Client:
    """A request whose ``receive`` reports ``http.disconnect`` once :meth:`leave` is called."""

    def __init__(self) -> None:
        self.left = asyncio.Event()

    def leave(self) -> None:
        self.left.set()

    async def receive(self) -> dict[str, Any]:
        await self.left.wait()
        return {"type": "http.disconnect"}


async def _tasks_besides(me: asyncio.Task[Any] | None) -> set[asyncio.Task[Any]]:
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return {t for t in asyncio.all_tasks() if t is not me and not t.done()}


async def test_work_that_finishes_first_gives_its_result_and_leaves_no_task() -> None:
    before = await _tasks_besides(asyncio.current_task())
    assert await unless_client_leaves(_Client(), asyncio.sleep(0, "answer")) == "answer"  # type: ignore[arg-type]
    assert await _tasks_besides(asyncio.current_task()) == before
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]


async def test_work_error_is_raised_unchanged() -> None:
    async def boom() -> None:
        await asyncio.sleep(0)
        raise ValueError("upstream broke")

    with pytest.raises(ValueError, match="upstream broke"):
        await unless_client_leaves(_Client(), boom())  # type: ignore[arg-type]


async def test_client_leaving_first_cancels_the_work_and_raises_client_gone() -> None:
    client = _Client()
    cancelled = asyncio.Event()

    async def slow() -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "late"

    asyncio.get_running_loop().call_soon(client.leave)
    with pytest.raises(ClientGone):
        await unless_client_leaves(client, slow())  # type: ignore[arg-type]
    assert cancelled.is_set()
    me = asyncio.current_task()
    assert me is not None and me.cancelling() == 0  # the caller is not left cancelled
    await asyncio.sleep(0)  # and no cancellation is pending on it either


async def test_work_that_swallows_the_cancellation_still_ends_in_client_gone() -> None:
    client = _Client()

    async def stubborn() -> str:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            return "swallowed"
        return "late"

    asyncio.get_running_loop().call_soon(client.leave)
    with pytest.raises(ClientGone):
        await unless_client_leaves(client, stubborn())  # type: ignore[arg-type]
    assert asyncio.current_task().cancelling() == 0  # type: ignore[union-attr]
    await asyncio.sleep(0)


async def test_a_cancellation_from_elsewhere_is_passed_on() -> None:
    started = asyncio.Event()

    async def caller() -> None:
        async def slow() -> None:
            started.set()
            await asyncio.sleep(60)

        await unless_client_leaves(_Client(), slow())  # type: ignore[arg-type]

    task = asyncio.ensure_future(caller())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_both_at_once_passes_the_outside_cancellation_on() -> None:
    client = _Client()
    started = asyncio.Event()

    async def caller() -> None:
        async def slow() -> None:
            started.set()
            await asyncio.sleep(60)

        await unless_client_leaves(client, slow())  # type: ignore[arg-type]

    task = asyncio.ensure_future(caller())
    await started.wait()
    client.leave()
    await asyncio.sleep(0)  # the watcher wakes and cancels the caller
    task.cancel()  # ... and so does someone else (server shutdown)
    with pytest.raises(asyncio.CancelledError):
        await task
