"""Session 15 (issue 14, the answer path): the replica connection keeps an answer's header fields as
llhttp hands them over and counts, bounds and decodes them once at the head's end; the bounds and
the header map are the same as when each field was handled in its own callback. And the guarded
listener's ``unless_client_leaves`` (now without a nested coroutine) still tells a client's departure
from any other cancellation."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.client_io import LOSS_KEY, ClientGone, ConnectionLoss, unless_client_leaves
from gateway.upstream_conn import MAX_HEAD_BYTES, MAX_HEADERS, UpstreamConnection, UpstreamProtocolError


class _Transport:
    def __init__(self) -> None:
        self.aborted = False

    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return self.aborted

    def abort(self) -> None:
        self.aborted = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default

    def get_write_buffer_size(self) -> int:
        return 0


def _conn() -> tuple[UpstreamConnection, _Transport, list[UpstreamConnection]]:
    idle: list[UpstreamConnection] = []
    conn = UpstreamConnection(idle.append, lambda c: None, asyncio.get_running_loop())
    t = _Transport()
    conn.connection_made(t)  # type: ignore[arg-type]
    return conn, t, idle


def _answer(*fields: bytes, body: bytes = b"ok", status: bytes = b"200 OK") -> bytes:
    head = b"HTTP/1.1 " + status + b"\r\nContent-Length: %d\r\n" % len(body) + b"".join(f + b"\r\n" for f in fields)
    return head + b"\r\n" + body


async def test_repeated_fields_are_joined_and_names_lowered() -> None:
    conn, _, idle = _conn()
    resp = conn.send(b"x", "r1")
    conn.data_received(_answer(b"X-Thing: a", b"x-thing: b", b"X-Instance-Id: i7", b"X-Request-Id: r1"))
    await resp.wait_head()
    assert resp.status == 200
    assert resp.headers == {"content-length": "2", "x-thing": "a, b", "x-instance-id": "i7", "x-request-id": "r1"}
    assert await resp.read_chunk() == b"ok"
    assert idle == [conn]  # whole, keep-alive: reused


async def test_a_field_split_over_reads_is_whole_in_the_map() -> None:
    conn, _, _ = _conn()
    resp = conn.send(b"x")
    data = _answer(b"X-Long: " + b"v" * 300)
    for i in range(0, len(data), 7):
        conn.data_received(data[i:i + 7])
    await resp.wait_head()
    assert resp.headers["x-long"] == "v" * 300
    assert await resp.read_chunk() == b"ok"


@pytest.mark.parametrize("fields, message", [
    ((b"Content-Length: 2",), "Content-Length"),  # llhttp refuses it first
    (tuple(b"X-F%d: v" % i for i in range(MAX_HEADERS)), f"more than {MAX_HEADERS} header fields"),
    (tuple(b"X-F%d: " % i + b"v" * 1000 for i in range(MAX_HEAD_BYTES // 1000 + 1)), "answer head larger than"),
])
async def test_bounds_and_repeated_content_length_are_refused(fields: tuple[bytes, ...], message: str) -> None:
    conn, t, idle = _conn()
    resp = conn.send(b"x")
    conn.data_received(_answer(*fields))
    with pytest.raises(UpstreamProtocolError, match=message):
        await resp.wait_head()
    assert t.aborted and conn.closed and idle == []


async def test_an_interim_answers_fields_are_not_the_answers() -> None:
    conn, _, _ = _conn()
    resp = conn.send(b"x")
    conn.data_received(b"HTTP/1.1 100 Continue\r\nX-Interim: 1\r\nContent-Encoding: gzip\r\n\r\n"
                       + _answer(b"X-Final: 2"))
    await resp.wait_head()
    assert resp.headers == {"content-length": "2", "x-final": "2"}
    assert await resp.read_chunk() == b"ok"


async def test_the_field_count_restarts_after_an_interim_answer() -> None:
    conn, _, _ = _conn()
    resp = conn.send(b"x")
    interim = b"HTTP/1.1 100 Continue\r\n" + b"".join(b"X-I%d: v\r\n" % i for i in range(MAX_HEADERS - 1)) + b"\r\n"
    conn.data_received(interim + _answer(*(b"X-F%d: v" % i for i in range(MAX_HEADERS - 2))))
    await resp.wait_head()
    assert len(resp.headers) == MAX_HEADERS - 1


class _Request:
    def __init__(self, loss: ConnectionLoss) -> None:
        self.scope: dict[str, Any] = {LOSS_KEY: loss}


async def test_work_swallowing_the_clients_cancellation_still_means_gone() -> None:
    loss = ConnectionLoss()
    reached = asyncio.Event()

    async def stubborn() -> str:
        reached.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            return "swallowed"
        return "never"

    main = asyncio.ensure_future(unless_client_leaves(_Request(loss), stubborn()))  # type: ignore[arg-type]
    await reached.wait()
    loss.fire()
    with pytest.raises(ClientGone):
        await asyncio.wait_for(main, 5)
    assert loss.pending() == 0


async def test_a_cancellation_by_someone_else_is_passed_on() -> None:
    loss = ConnectionLoss()
    reached = asyncio.Event()

    async def slow() -> str:
        reached.set()
        await asyncio.sleep(30)
        return "never"

    main = asyncio.ensure_future(unless_client_leaves(_Request(loss), slow()))  # type: ignore[arg-type]
    await reached.wait()
    main.cancel()
    with pytest.raises(asyncio.CancelledError):
        await main
    assert loss.pending() == 0
