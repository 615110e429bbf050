"""Session 5 (issue 14): on the guarded listener, unless_client_leaves learns of a lost
connection from the protocol's ``connection_lost`` (a callback in the request's scope) instead
of a timer and a watcher task reading ``receive``; other callers keep the timer/watcher path."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

import gateway.client_io as client_io
from gateway.client_io import LOSS_KEY, ClientGone, ConnectionLoss, unless_client_leaves


class _Request:
    """A request with a scope holding a ConnectionLoss; ``receive`` never reports anything."""

    def __init__(self, loss: ConnectionLoss | None) -> None:
        self.scope: dict[str, Any] = {} if loss is None else {LOSS_KEY: loss}
        self.receives = 0
        self.left = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        await self.left.wait()
        return {"type": "http.disconnect"}


def _count_tasks(loop: asyncio.AbstractEventLoop) -> list[Any]:
    created: list[Any] = []
    loop.set_task_factory(lambda lp, coro, **kw: created.append(coro) or asyncio.Task(coro, loop=lp, **kw))
    return created


async def test_a_lost_connection_cancels_the_work_at_once_without_a_watcher(monkeypatch) -> None:
    monkeypatch.setattr(client_io, "WATCH_AFTER_S", 3600.0)  # the timer path could not notice in time
    loss = ConnectionLoss()
    req = _Request(loss)
    reached = asyncio.Event()

    async def slow() -> str:
        reached.set()
        await asyncio.sleep(30)
        return "never"

    loop = asyncio.get_running_loop()
    main = asyncio.ensure_future(unless_client_leaves(req, slow()))  # type: ignore[arg-type]
    await reached.wait()
    created = _count_tasks(loop)
    try:
        loss.fire()
        with pytest.raises(ClientGone):
            await asyncio.wait_for(main, 5)
    finally:
        loop.set_task_factory(None)
    assert created == [] and req.receives == 0
    assert loss.pending() == 0  # the callback was taken out


async def test_work_that_waits_long_returns_its_result_and_leaves_no_callback() -> None:
    loss = ConnectionLoss()
    req = _Request(loss)
    loop = asyncio.get_running_loop()
    created = _count_tasks(loop)
    try:
        async def waits() -> str:
            await asyncio.sleep(client_io.WATCH_AFTER_S * 3)  # longer than the timer path's delay
            return "answer"

        assert await unless_client_leaves(req, waits()) == "answer"  # type: ignore[arg-type]
    finally:
        loop.set_task_factory(None)
    assert created == [] and req.receives == 0 and loss.pending() == 0


async def test_an_outside_cancellation_is_passed_on_and_the_callback_removed() -> None:
    loss = ConnectionLoss()
    req = _Request(loss)
    reached = asyncio.Event()

    async def slow() -> None:
        reached.set()
        await asyncio.sleep(30)

    task = asyncio.ensure_future(unless_client_leaves(req, slow()))  # type: ignore[arg-type]
    await reached.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert loss.pending() == 0
    loss.fire()  # later loss: nothing to call


async def test_a_connection_already_lost_falls_back_to_receive() -> None:
    loss = ConnectionLoss()
    loss.fire()
    req = _Request(loss)
    req.left.set()  # receive reports the disconnect, as uvicorn does once the connection is lost

    async def slow() -> str:
        await asyncio.sleep(30)
        return "never"

    with pytest.raises(ClientGone):
        await asyncio.wait_for(unless_client_leaves(req, slow()), 5)  # type: ignore[arg-type]
    assert req.receives == 1


def test_a_failing_callback_does_not_stop_the_others() -> None:
    loss = ConnectionLoss()
    seen: list[str] = []

    def bad() -> None:
        raise RuntimeError("bug")

    loss.add(bad)
    loss.add(lambda: seen.append("ok"))
    loss.fire()
    loss.fire()  # once only
    assert seen == ["ok"] and loss.lost and not loss.add(lambda: None)


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_the_guarded_listener_cancels_the_work_when_the_client_hangs_up(monkeypatch, parser: str) -> None:
    from starlette.requests import Request

    from gateway.server import uvicorn_config
    from tests.support.listeners import serving

    monkeypatch.setattr(client_io, "WATCH_AFTER_S", 3600.0)  # only the connection_lost path can notice
    outcome: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    started = asyncio.Event()

    async def slow() -> str:
        started.set()
        await asyncio.sleep(30)
        return "never"

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        try:
            await unless_client_leaves(Request(scope, receive, send), slow())
            outcome.set_result("finished")
        except ClientGone:
            outcome.set_result("gone")

    async with serving() as serve:
        host, port = await serve(uvicorn_config(app, "127.0.0.1", 0, http=parser))
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        await asyncio.wait_for(started.wait(), 5)
        writer.close()
        assert await asyncio.wait_for(outcome, 5) == "gone"


async def test_a_stream_on_the_guarded_listener_ends_when_the_client_hangs_up_without_reading_receive() -> None:
    from collections.abc import AsyncGenerator

    from gateway.client_io import EndingStreamingResponse
    from gateway.server import uvicorn_config
    from tests.support.listeners import serving

    receives = 0
    ends: list[str] = []
    first_sent = asyncio.Event()

    async def body() -> AsyncGenerator[bytes, None]:
        yield b"data: 0\n\n"
        first_sent.set()
        await asyncio.sleep(30)
        yield b"data: never\n\n"

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()

        async def counting_receive() -> Any:
            nonlocal receives
            receives += 1
            return await receive()

        resp = EndingStreamingResponse(body(), on_end=lambda: ends.append("end"), media_type="text/event-stream")
        await resp(scope, counting_receive, send)

    async with serving() as serve:
        host, port = await serve(uvicorn_config(app, "127.0.0.1", 0, http="httptools"))
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}")
        await asyncio.wait_for(reader.readuntil(b"data: 0\n\n"), 5)
        await asyncio.wait_for(first_sent.wait(), 5)
        writer.close()
        deadline = asyncio.get_running_loop().time() + 5
        while not ends and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
    assert ends == ["end"] and receives == 0  # ended by connection_lost, no watcher reading receive


async def test_a_whole_stream_with_a_loss_in_scope_is_sent_and_leaves_no_callback() -> None:
    from collections.abc import AsyncGenerator

    from gateway.client_io import EndingStreamingResponse

    loss = ConnectionLoss()
    sent: list[dict[str, Any]] = []
    ends: list[int] = []

    async def body() -> AsyncGenerator[bytes, None]:
        for i in range(3):
            await asyncio.sleep(0)
            yield b"data: %d\n\n" % i

    reads: list[int] = []

    async def receive() -> dict[str, Any]:
        reads.append(1)
        await asyncio.Event().wait()
        return {}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, LOSS_KEY: loss}
    await EndingStreamingResponse(body(), on_end=lambda: ends.append(1))(scope, receive, send)
    await asyncio.sleep(0)
    assert len(sent) == 5 and ends == [1] and loss.pending() == 0 and reads == []
