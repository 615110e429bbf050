"""Session 8, upstream path: the first-byte budget on one timer per pool (gateway/upstream_deadline.py,
``UpstreamResponse.watch_deadline``) instead of an ``asyncio.timeout`` per call, and the request head
from a per-(method, URL) template (``UpstreamPool.head``). The budget must still bound every wait
before the first body byte (a connection from a full pool, the head, the first chunk, a refused
answer's body), abort the connection when it passes, and stop at the first byte (the rest of the
answer is the caller's read timeout's); the template must give the same bytes as the general path
and still refuse CR/LF."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.proxy import UpstreamFailure, make_session, open_upstream
from gateway.upstream_deadline import DeadlineWatch
from gateway.upstream_pool import UpstreamPool

pytestmark = pytest.mark.filterwarnings("ignore:Overriding the \"event_loop_policy\" fixture:DeprecationWarning")

BODY = json.dumps({"id": "x", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
Reply = Callable[[asyncio.StreamWriter], Awaitable[None]]


@pytest.fixture(params=["asyncio", "uvloop"], scope="module")
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Every test on both loops: the gateway serves on uvloop, other tests use asyncio's."""
    return uvloop.EventLoopPolicy() if request.param == "uvloop" else asyncio.DefaultEventLoopPolicy()


@pytest.fixture
async def replica() -> AsyncIterator[Callable[[Reply], Awaitable[str]]]:
    """A raw replica: reads one request head + body per turn, then runs ``reply(writer)``."""
    servers: list[asyncio.base_events.Server] = []

    async def start(reply: Reply) -> str:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length:"))
                    await reader.readexactly(length)
                    await reply(writer)
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                writer.close()

        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(srv)
        return f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/v1/completions"

    yield start
    for srv in servers:
        srv.close()


async def wait_for(cond: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not cond():
            await asyncio.sleep(0.005)


class Item:
    def __init__(self, name: str, log: list[tuple[str, float]]) -> None:
        self.name, self.log = name, log

    def expire(self) -> None:
        self.log.append((self.name, asyncio.get_running_loop().time()))


async def test_watch_expires_each_item_once_at_its_deadline_and_never_a_discarded_one() -> None:
    loop = asyncio.get_running_loop()
    log: list[tuple[str, float]] = []
    watch = DeadlineWatch()
    t0 = loop.time()
    late, early, gone = Item("late", log), Item("early", log), Item("gone", log)
    watch.add(late, t0 + 0.15, loop)
    watch.add(early, t0 + 0.05, loop)  # earlier than the armed timer: moves it
    watch.add(gone, t0 + 0.02, loop)
    watch.discard(gone)
    await wait_for(lambda: len(log) == 2)
    assert [name for name, _ in log] == ["early", "late"]
    assert log[0][1] >= t0 + 0.05 - 0.002 and log[1][1] >= t0 + 0.15 - 0.002  # uvloop: ms clock
    assert watch.pending == 0
    await asyncio.sleep(0.05)
    assert len(log) == 2  # once each
    watch.add(Item("closed", log), loop.time() + 0.01, loop)
    watch.close()
    await asyncio.sleep(0.05)
    assert len(log) == 2 and watch.pending == 0


async def test_budget_bounds_the_wait_for_the_first_chunk_after_the_head(replica) -> None:
    async def head_only(w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY))
        await asyncio.sleep(30)

    url = await replica(head_only)
    pool = make_session(4, 2.0, 5.0)
    try:
        t0 = asyncio.get_running_loop().time()
        with pytest.raises(UpstreamFailure) as ei:
            await open_upstream(pool, url, {"prompt": "p"}, {"X-Request-Id": "r"}, 0.2)
        assert ei.value.kind == "timeout" and ei.value.retryable
        assert 0.15 <= asyncio.get_running_loop().time() - t0 < 2.0
        await wait_for(lambda: pool.open_connections == 0)  # aborted, never reused
        assert pool.deadlines_pending == 0
    finally:
        await pool.close()


async def test_budget_bounds_the_wait_for_a_connection_from_a_full_pool(replica) -> None:
    gate = asyncio.Event()

    async def held(w: asyncio.StreamWriter) -> None:
        await gate.wait()
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)

    url = await replica(held)
    pool = make_session(1, 2.0, 5.0)
    try:
        first = asyncio.ensure_future(open_upstream(pool, url, {}, {}, 5.0))
        await wait_for(lambda: pool.open_connections == 1)
        with pytest.raises(UpstreamFailure) as ei:
            await open_upstream(pool, url, {}, {}, 0.1)  # no free connection within its budget
        assert ei.value.kind == "timeout"
        gate.set()
        up = await first
        assert up.first_chunk + await up.read_rest() == BODY
        up.close()
        assert pool.deadlines_pending == 0
    finally:
        await pool.close()


async def test_budget_stops_at_the_first_byte_and_bounds_a_refusals_body(replica) -> None:
    turn = 0

    async def reply(w: asyncio.StreamWriter) -> None:
        nonlocal turn
        turn += 1
        if turn == 1:  # first chunk at once, the rest after the budget: not cut (the caller's read timeout)
            w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY[:5])
            await w.drain()
            await asyncio.sleep(0.3)
            w.write(BODY[5:])
        else:  # a 503 whose body never comes: bounded by the budget
            w.write(b"HTTP/1.1 503 Busy\r\nContent-Length: 100\r\n\r\n{")
            await asyncio.sleep(30)

    url = await replica(reply)
    pool = make_session(4, 2.0, 5.0)
    try:
        up = await open_upstream(pool, url, {}, {}, 0.1)
        assert up.first_chunk == BODY[:5] and pool.deadlines_pending == 0
        assert up.first_chunk + await up.read_rest() == BODY
        up.close()
        with pytest.raises(UpstreamFailure) as ei:
            await open_upstream(pool, url, {}, {}, 0.1)
        assert ei.value.kind == "timeout"
        await wait_for(lambda: pool.open_connections == 0)
    finally:
        await pool.close()


async def test_many_calls_leave_no_deadline_behind(replica) -> None:
    async def ok(w: asyncio.StreamWriter) -> None:
        w.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY)

    url = await replica(ok)
    pool = make_session(8, 2.0, 5.0)
    try:
        async def one(budget: float) -> bytes:
            up = await open_upstream(pool, url, {}, {"X-Request-Id": "r"}, budget)
            try:
                return up.first_chunk + await up.read_rest()
            finally:
                up.close()

        results = await asyncio.gather(*(one(5.0 if i % 2 else 60.0) for i in range(40)))
        assert results == [BODY] * 40 and pool.deadlines_pending == 0
    finally:
        await pool.close()


def _head_before(method: str, url: str, headers: dict[str, str], body_len: int) -> bytes:
    """``UpstreamPool.head`` as it was before the template (session 7), for this pool's defaults."""
    fields = {"accept-encoding": ("Accept-Encoding", "identity")}
    for k, v in headers.items():
        fields[k.lower()] = (k, v)
    for own in ("host", "content-length", "transfer-encoding"):
        fields.pop(own, None)
    lines = [f"{method} /v1/chat/completions HTTP/1.1", "Host: 127.0.0.1:8123"]
    lines.extend(f"{k}: {v}" for k, v in fields.values())
    lines.append(f"Content-Length: {body_len}")
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n"


_NAME = st.text(alphabet="ABCXYZabcxyz-_0123456789", min_size=1, max_size=12)
_VALUE = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=20)


@settings(max_examples=200, deadline=None)
@given(headers=st.dictionaries(_NAME | st.sampled_from(["Host", "content-LENGTH", "Accept-Encoding",
                                                        "Transfer-Encoding", "X-Request-Id"]), _VALUE, max_size=5),
       body_len=st.integers(0, 10**7), method=st.sampled_from(["POST", "GET"]))
def test_head_from_the_template_equals_the_general_head(headers: dict[str, str], body_len: int, method: str) -> None:
    pool = UpstreamPool(1, 1.0, default_headers={"Accept-Encoding": "identity"})
    url = "http://127.0.0.1:8123/v1/chat/completions"
    twice = [pool.head(method, url, headers, body_len) for _ in range(2)]  # the second from the cache
    general = _head_before(method, url, headers, body_len)
    assert twice[0] == twice[1] == general


@pytest.mark.parametrize("headers", [{"X-Request-Id": "a\r\nX-Evil: 1"}, {"X-Request-Id": "a\nb"},
                                     {"X-A\rB": "v"}, {"traceparent": "x\r"}])
def test_template_head_refuses_cr_or_lf_in_any_header(headers: dict[str, str]) -> None:
    pool = UpstreamPool(1, 1.0, default_headers={"Accept-Encoding": "identity"})
    url = "http://127.0.0.1:8123/v1/completions"
    pool.head("POST", url, {"X-Request-Id": "ok"}, 2)  # the template exists
    with pytest.raises(ValueError):
        pool.head("POST", url, headers, 2)
    with pytest.raises(ValueError):
        pool.head("POST", url, {"X-Request-Id": "caf\u20ac"}, 2)  # not latin-1
