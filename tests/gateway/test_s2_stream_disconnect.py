"""EndingStreamingResponse under ASGI 2.3 (uvicorn) streams in the calling task with one disconnect
watcher instead of Starlette's anyio task group: the same answers for a whole stream, a client that
leaves mid-stream and a cancellation from elsewhere; the request ends exactly once every time."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from typing import Any

import pytest

from gateway.client_io import EndingStreamingResponse

SCOPE: dict[str, Any] = {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}}


class _Client:
    def __init__(self) -> None:
        self.left = asyncio.Event()
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        await self.left.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)


def _answer(chunks: int, gate: asyncio.Event | None, log: list[str]) -> tuple[EndingStreamingResponse, list[int]]:
    ends: list[int] = []

    async def body() -> AsyncGenerator[bytes, None]:
        try:
            for i in range(chunks):
                if gate is not None and i == 1:
                    await gate.wait()
                yield b"data: %d\n\n" % i
            log.append("whole")
        except BaseException as exc:
            log.append(type(exc).__name__)
            raise
        finally:
            log.append("finally")

    resp = EndingStreamingResponse(body(), on_end=lambda: ends.append(1), media_type="text/event-stream")
    return resp, ends


async def _others(me: asyncio.Task[Any] | None) -> set[asyncio.Task[Any]]:
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    return {t for t in asyncio.all_tasks() if t is not me and not t.done()}


async def test_whole_stream_is_sent_and_ends_once_leaving_no_task() -> None:
    client, log = _Client(), []
    resp, ends = _answer(3, None, log)
    await resp(SCOPE, client.receive, client.send)
    assert [m["type"] for m in client.sent] == ["http.response.start"] + ["http.response.body"] * 4
    assert [m.get("body") for m in client.sent[1:]] == [b"data: 0\n\n", b"data: 1\n\n", b"data: 2\n\n", b""]
    assert log == ["whole", "finally"] and ends == [1]
    assert not await _others(asyncio.current_task())
    assert not asyncio.current_task().cancelling()


async def test_client_leaving_mid_stream_cancels_it_and_the_call_returns() -> None:
    client, log, gate = _Client(), [], asyncio.Event()
    resp, ends = _answer(3, gate, log)
    call = asyncio.ensure_future(resp(SCOPE, client.receive, client.send))
    while len(client.sent) < 2:  # the start and the first chunk are out
        await asyncio.sleep(0)
    client.left.set()
    await call  # returns normally, like Starlette's task group
    assert log == ["CancelledError", "finally"] and ends == [1]
    assert client.sent[-1].get("body") == b"data: 0\n\n"  # nothing after the disconnect
    assert not call.cancelled()


async def test_a_cancellation_from_elsewhere_is_passed_on() -> None:
    client, log, gate = _Client(), [], asyncio.Event()
    resp, ends = _answer(3, gate, log)
    call = asyncio.ensure_future(resp(SCOPE, client.receive, client.send))
    while len(client.sent) < 2:
        await asyncio.sleep(0)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert log == ["CancelledError", "finally"] and ends == [1]
    assert not await _others(asyncio.current_task())
