"""The upstream connection pool (gateway/upstream_pool.py, gateway/upstream_conn.py) against a raw
loopback replica that sends exactly the bytes each test scripts: keep-alive reuse, no reuse after a
cancelled or cut answer or ``Connection: close``, framing refusals (smuggling shapes, bounds),
first-byte timeout, SSE chunks relayed as they come, the pool bound, and the stale keep-alive retry."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
import uvloop

from gateway.proxy import UpstreamFailure, make_session, open_upstream
from gateway.upstream_conn import MAX_HEAD_BYTES, UpstreamConnectionLost, UpstreamProtocolError
from gateway.upstream_pool import UpstreamPool

# the override is deprecated in pytest-asyncio 1.x in favour of a conftest hook (shared file: not here)
pytestmark = pytest.mark.filterwarnings("ignore:Overriding the \"event_loop_policy\" fixture:DeprecationWarning")

Reply = Callable[[int, int, bytes, asyncio.StreamWriter], Awaitable[bool]]
OK_BODY = json.dumps({"id": "x", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()


def ok(body: bytes = OK_BODY, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n" % (
        len(body), extra) + body


@pytest.fixture(params=["asyncio", "uvloop"], scope="module")
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Every test on both loops: the gateway serves on uvloop, other tests use asyncio's."""
    return uvloop.EventLoopPolicy() if request.param == "uvloop" else asyncio.DefaultEventLoopPolicy()


@dataclass
class Replica:
    """A raw HTTP/1.1 server: ``reply(conn_no, req_no, head, writer)`` writes an answer, returns False to hang up."""

    reply: Reply
    url: str = ""
    connections: int = 0
    open_now: int = 0
    most_open: int = 0
    requests: list[tuple[int, bytes]] = field(default_factory=list)
    closed: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn_no = self.connections
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        n = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                await reader.readexactly(length)
                n += 1
                self.requests.append((conn_no, head))
                if not await self.reply(conn_no, n, head, writer):
                    return
                await writer.drain()
        finally:
            self.open_now -= 1
            writer.close()
            self.closed.set()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Reply], Awaitable[Replica]]]:
    servers: list[asyncio.base_events.Server] = []

    async def start(reply: Reply) -> Replica:
        rep = Replica(reply)
        srv = await asyncio.start_server(rep.handle, "127.0.0.1", 0)
        servers.append(srv)
        rep.url = f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
        return rep

    yield start
    for srv in servers:
        srv.close()


def answer(data: bytes, keep: bool = True) -> Reply:
    async def reply(conn: int, n: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(data)
        return keep
    return reply


async def wait_for(cond: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not cond():
            await asyncio.sleep(0.005)


async def call(pool: UpstreamPool, rep: Replica, budget: float = 5.0) -> bytes:
    up = await open_upstream(pool, rep.url + "/v1/completions", {"prompt": "p"}, {"X-Request-Id": "r"}, budget)
    try:
        return up.first_chunk + await up.read_rest()
    finally:
        up.close()


async def test_keep_alive_connection_is_reused_and_sends_identity(serve) -> None:
    rep = await serve(answer(ok()))
    pool = make_session(4, 2.0, 5.0)
    try:
        assert await call(pool, rep) == OK_BODY
        assert await call(pool, rep) == OK_BODY
        assert rep.connections == 1 and pool.open_connections == 1
        head = rep.requests[0][1].lower()
        assert b"accept-encoding: identity\r\n" in head and b"content-type: application/json\r\n" in head
        assert head.startswith(b"post /v1/completions http/1.1\r\n")
    finally:
        await pool.close()


async def test_connection_close_from_the_replica_is_honoured(serve) -> None:
    rep = await serve(answer(ok(extra=b"Connection: close\r\n")))
    pool = make_session(4, 2.0, 5.0)
    try:
        assert await call(pool, rep) == OK_BODY
        assert await call(pool, rep) == OK_BODY
        assert rep.connections == 2
    finally:
        await pool.close()


async def test_cancelled_mid_body_connection_is_never_reused(serve) -> None:
    gate = asyncio.Event()

    async def reply(conn: int, n: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        if conn == 1:  # half the body, then wait: the reader is cancelled meanwhile
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n12345")
            await w.drain()
            await gate.wait()
            w.write(b"67890")  # a late rest must not become the next request's answer
            return True
        w.write(ok())
        return True

    rep = await serve(reply)
    pool = make_session(4, 2.0, 5.0)
    try:
        up = await open_upstream(pool, rep.url + "/x", {}, {}, 5.0)
        assert up.first_chunk == b"12345" and not up.body_received()
        task = asyncio.ensure_future(up.read_rest())
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        up.close()  # what the pipeline's end_attempt does
        gate.set()
        assert await call(pool, rep) == OK_BODY
        assert rep.connections == 2
        await wait_for(lambda: pool.open_connections == 1)
    finally:
        await pool.close()


async def test_first_byte_timeout_aborts_the_connection(serve) -> None:
    async def silent(conn: int, n: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        await asyncio.sleep(30)
        return False

    rep = await serve(silent)
    pool = make_session(4, 2.0, 5.0)
    try:
        with pytest.raises(UpstreamFailure) as ei:
            await call(pool, rep, budget=0.2)
        assert ei.value.kind == "timeout" and ei.value.retryable
        await wait_for(lambda: pool.open_connections == 0)
    finally:
        await pool.close()


@pytest.mark.parametrize("raw", [
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nhello",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX3\r\nabc\r\n0\r\n\r\n",
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-H%d: v\r\n" % i for i in range(150)) + b"Content-Length: 2\r\n\r\n{}",
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * (MAX_HEAD_BYTES + 10) + b"\r\nContent-Length: 2\r\n\r\n{}",
    b"NOT-HTTP garbage\r\n\r\n",
], ids=["cl+te", "te+cl", "two-cl", "te-gzip", "bad-chunk-size", "bad-chunk-end", "upgrade", "150-headers",
        "huge-head", "garbage"])
async def test_framing_violations_are_protocol_failures_and_close_the_connection(serve, raw: bytes) -> None:
    rep = await serve(answer(raw))
    pool = make_session(4, 2.0, 5.0)
    try:
        with pytest.raises((UpstreamFailure, UpstreamProtocolError)) as ei:  # before or after the first byte
            await call(pool, rep)
        if isinstance(ei.value, UpstreamFailure):
            assert ei.value.kind == "protocol" and ei.value.replica_fault and ei.value.retryable
        await wait_for(lambda: pool.open_connections == 0)
        await wait_for(rep.closed.is_set)
    finally:
        await pool.close()


async def test_bytes_after_the_answer_keep_the_answer_but_not_the_connection(serve) -> None:
    rep = await serve(answer(ok() + b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"))
    pool = make_session(4, 2.0, 5.0)
    try:
        assert await call(pool, rep) == OK_BODY
        assert await call(pool, rep) == OK_BODY
        assert rep.connections == 2
    finally:
        await pool.close()


async def test_unsolicited_bytes_on_an_idle_connection_close_it(serve) -> None:
    async def reply(conn: int, n: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(ok())
        if conn == 1:
            await w.drain()
            await asyncio.sleep(0.05)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsmuggl")
        return True

    rep = await serve(reply)
    pool = make_session(4, 2.0, 5.0)
    try:
        assert await call(pool, rep) == OK_BODY
        await wait_for(lambda: pool.open_connections == 0)
        assert await call(pool, rep) == OK_BODY
        assert rep.connections == 2
    finally:
        await pool.close()


async def test_sse_chunks_are_relayed_as_they_come(serve) -> None:
    step = asyncio.Event()

    async def reply(conn: int, n: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        ev1 = b'data: {"a":1}\n\n'
        w.write(b"%x\r\n%s\r\n" % (len(ev1), ev1))
        await w.drain()
        await step.wait()  # the client must see event 1 before event 2 exists
        ev2 = b"data: [DONE]\n\n"
        w.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(ev2), ev2))
        return True

    rep = await serve(reply)
    pool = make_session(4, 2.0, 5.0)
    try:
        up = await open_upstream(pool, rep.url + "/x", {}, {}, 5.0)
        assert up.first_chunk == b'data: {"a":1}\n\n'
        step.set()
        assert await up.read_chunk() == b"data: [DONE]\n\n"
        assert await up.read_chunk() == b""
        up.close()
        assert await call(pool, rep) == b'data: {"a":1}\n\ndata: [DONE]\n\n'  # the same connection again
    finally:
        step.set()
        await pool.close()
    assert rep.connections == 1


async def test_pool_limit_bounds_open_connections(serve) -> None:
    release = asyncio.Event()

    async def reply(conn: int, n: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        await release.wait()
        w.write(ok())
        return True

    rep = await serve(reply)
    pool = make_session(1, 2.0, 5.0)
    try:
        tasks = [asyncio.ensure_future(call(pool, rep)) for _ in range(3)]
        await wait_for(lambda: len(rep.requests) == 1)
        assert pool.open_connections == 1
        release.set()
        assert await asyncio.gather(*tasks) == [OK_BODY] * 3
        assert rep.most_open == 1 and rep.connections == 1
    finally:
        await pool.close()


async def test_no_body_statuses_and_body_until_close(serve) -> None:
    async def reply(conn: int, n: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        if n == 1:
            w.write(b"HTTP/1.1 204 No Content\r\n\r\n")
            return True
        if n == 2:
            w.write(b"HTTP/1.1 100 Continue\r\n\r\n" + ok())
            return True
        w.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + OK_BODY)
        return False  # the body ends with the connection

    rep = await serve(reply)
    pool = UpstreamPool(2, 2.0)
    try:
        resp = await pool.request("POST", rep.url + "/x", b"{}")
        assert resp.status == 204 and await resp.read_chunk() == b""
        resp.close()
        resp = await pool.request("POST", rep.url + "/x", b"{}")
        assert resp.status == 200 and await resp.read_chunk() == OK_BODY
        resp.close()
        assert await call(pool, rep) == OK_BODY
        assert rep.connections == 1
        await wait_for(lambda: pool.open_connections == 0)  # until-close: never kept
    finally:
        await pool.close()


async def test_kept_alive_connection_closed_under_the_request_is_retried_once(serve) -> None:
    async def reply(conn: int, n: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        if conn == 1 and n == 2:
            return False  # the replica hangs up instead of answering the second request
        w.write(ok())
        return True

    rep = await serve(reply)
    pool = make_session(4, 2.0, 5.0)
    try:
        assert await call(pool, rep) == OK_BODY
        assert await call(pool, rep) == OK_BODY
        assert rep.connections == 2 and len(rep.requests) == 3
    finally:
        await pool.close()


async def test_answer_cut_short_fails_and_is_not_retried(serve) -> None:
    rep = await serve(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"a\":", keep=False))
    pool = make_session(4, 2.0, 5.0)
    try:
        up = await open_upstream(pool, rep.url + "/x", {}, {}, 5.0)
        with pytest.raises(UpstreamConnectionLost):
            await up.read_rest()
        up.close()
        assert len(rep.requests) == 1
    finally:
        await pool.close()


async def test_refused_connection_is_a_connect_failure_that_never_reached(serve) -> None:
    rep = await serve(answer(ok()))
    pool = make_session(4, 2.0, 5.0)
    try:
        with pytest.raises(UpstreamFailure) as ei:
            await open_upstream(pool, "http://127.0.0.1:9/x", {}, {}, 5.0)
        assert ei.value.kind == "connect" and not ei.value.reached
        assert pool.open_connections == 0
        assert await call(pool, rep) == OK_BODY
    finally:
        await pool.close()


async def test_header_injection_and_unsupported_methods_are_refused() -> None:
    pool = UpstreamPool(1, 1.0)
    with pytest.raises(ValueError):
        pool.head("POST", "http://127.0.0.1:1/x", {"X-Request-Id": "a\r\nX-Evil: 1"}, 0)
    with pytest.raises(ValueError):
        pool.head("POST", "http://127.0.0.1:1/x", {"X-A\nB": "v"}, 0)
    with pytest.raises(ValueError):
        pool.head("HEAD", "http://127.0.0.1:1/x", {}, 0)
    head = pool.head("POST", "http://127.0.0.1:1/x?q=1", {"content-length": "99", "Host": "evil"}, 3)
    assert head == b"POST /x?q=1 HTTP/1.1\r\nHost: 127.0.0.1:1\r\nContent-Length: 3\r\n\r\n"
    await pool.close()


async def test_idle_connections_are_closed_after_the_keepalive(serve) -> None:
    rep = await serve(answer(ok()))
    pool = UpstreamPool(4, 2.0, keepalive_s=0.05)
    try:
        resp = await pool.request("POST", rep.url + "/x", b"{}")
        assert await resp.read_chunk() == OK_BODY
        resp.close()
        assert pool.idle_connections == 1
        await wait_for(lambda: pool.open_connections == 0)
        await wait_for(rep.closed.is_set)
        resp = await pool.request("POST", rep.url + "/x", b"{}")  # a new one
        resp.close()
        assert rep.connections == 2
    finally:
        await pool.close()
