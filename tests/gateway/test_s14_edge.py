"""Session 14 edge cuts: one response parser per upstream connection (gateway/upstream_conn.py) and the
coalescing transport's end-of-step callback dropped once an answer was flushed (gateway/coalesce.py).

The upstream connection is driven over a scripted transport (no sockets): every answer framing the
pool accepts must parse the same on the second, third ... answer of a kept-alive connection as on its
first, and the strictness (bytes after an answer, a second answer, bad framing) must hold on a reused
connection too."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.coalesce import CoalescingTransport
from gateway.upstream_conn import UpstreamConnection, UpstreamProtocolError


class ScriptTransport:
    """The part of a transport the upstream connection uses; records writes and aborts."""

    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.aborted = False
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing or self.aborted

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default  # no socket: the quiet() check is not exercised here

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def cl(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n" % (len(body), extra) + body


CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
INTERIM = b"HTTP/1.1 100 Continue\r\n\r\n" + cl(b"after-100")
NO_BODY = b"HTTP/1.1 204 No Content\r\n\r\n"
#: (answer bytes, status, body) in the order a kept-alive connection carries them
SEQUENCE = [(cl(b"one"), 200, b"one"), (CHUNKED, 200, b"abcde"), (INTERIM, 200, b"after-100"),
            (NO_BODY, 204, b""), (cl(b"five", b"X-Request-Id: r5\r\n"), 200, b"five")]


async def _exchange(conn: UpstreamConnection, wire: bytes, rid: str | None = None, split: int = 0) -> Any:
    resp = conn.send(b"POST / HTTP/1.1\r\n\r\n", rid)
    for piece in (p for p in ([wire[:split], wire[split:]] if split else [wire]) if p):
        conn.data_received(piece)
    await resp.wait_head()
    body = b""
    while chunk := await resp.read_chunk():
        body += chunk
    resp.close()
    return resp, body


@pytest.mark.parametrize("split", [0, 7, 40])
async def test_every_answer_of_a_kept_alive_connection_parses_as_the_first(split: int) -> None:
    idle: list[UpstreamConnection] = []
    conn = UpstreamConnection(idle.append, lambda c: None, asyncio.get_running_loop())
    t = ScriptTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    for n, (wire, status, body) in enumerate(SEQUENCE, 1):
        resp, got = await _exchange(conn, wire, "r5" if n == 5 else None, split)
        assert (resp.status, got) == (status, body), n
        assert len(idle) == n and not t.aborted  # back to the pool after each clean answer
        assert conn.usable()


async def test_a_reused_connection_still_refuses_bytes_after_the_answer() -> None:
    idle: list[UpstreamConnection] = []
    conn = UpstreamConnection(idle.append, lambda c: None, asyncio.get_running_loop())
    t = ScriptTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    await _exchange(conn, cl(b"first"))
    resp, got = await _exchange(conn, cl(b"second") + b"HTTP/1.1 200 OK\r\n")  # a stray second answer follows
    assert got == b"second"  # the answer itself was whole
    assert t.aborted and conn.closed and len(idle) == 1  # but the connection is never reused


async def test_a_reused_connection_still_refuses_smuggling_framing_and_stray_echoes() -> None:
    conn = UpstreamConnection(lambda c: None, lambda c: None, asyncio.get_running_loop())
    t = ScriptTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    await _exchange(conn, cl(b"first"))
    resp = conn.send(b"POST / HTTP/1.1\r\n\r\n", None)
    conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    with pytest.raises(UpstreamProtocolError):
        await resp.wait_head()
    assert t.aborted and conn.closed

    conn = UpstreamConnection(lambda c: None, lambda c: None, asyncio.get_running_loop())
    t = ScriptTransport()
    conn.connection_made(t)  # type: ignore[arg-type]
    await _exchange(conn, cl(b"first", b"X-Request-Id: a\r\n"), "a")
    resp = conn.send(b"POST / HTTP/1.1\r\n\r\n", "b")
    conn.data_received(cl(b"late", b"X-Request-Id: a\r\n"))  # the echo of the previous request
    with pytest.raises(UpstreamProtocolError, match="another request"):
        await resp.wait_head()
    assert t.aborted


class _Call:
    def __init__(self, cb: Any, args: tuple[Any, ...]) -> None:
        self.cb, self.args, self.cancelled = cb, args, False

    def cancel(self) -> None:
        self.cancelled = True


class CountingLoop:
    """Records ``call_soon`` callbacks; runs the ones not cancelled on :meth:`run_step` (a loop step's end)."""

    def __init__(self) -> None:
        self.calls: list[_Call] = []

    def call_soon(self, cb: Any, *args: Any) -> _Call:
        self.calls.append(call := _Call(cb, args))
        return call

    def run_step(self) -> int:
        calls, self.calls = self.calls, []
        live = [c for c in calls if not c.cancelled]
        for c in live:
            c.cb(*c.args)
        return len(live)


def test_a_flushed_answer_leaves_no_end_of_step_callback_and_later_writes_still_coalesce() -> None:
    t, loop = ScriptTransport(), CountingLoop()
    c = CoalescingTransport(t, loop)  # type: ignore[arg-type]
    c.write(b"head")
    c.write(b"body")
    c.flush()  # the answer is complete (gateway/http_guard.py flush_answer)
    assert t.written == [b"headbody"]
    assert loop.run_step() == 0  # nothing left for the end of the step
    c.write(b"next-head")  # a later write in a later step is held and leaves at that step's end
    c.write(b"next-body")
    assert t.written == [b"headbody"]
    assert loop.run_step() == 1
    assert t.written == [b"headbody", b"next-headnext-body"]
    c.write(b"a")
    c.flush()
    c.write(b"b")  # after a flush in the same step: held again, and leaves at the step's end
    assert loop.run_step() == 1 and t.written[-2:] == [b"a", b"b"]
