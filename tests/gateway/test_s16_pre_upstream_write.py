"""Session 16 (pre): the upstream request written with fewer steps.

- The head's caller part from a per-header-names template (gateway/upstream_head.py): the same bytes as
  the general, field-by-field path (and as the head before session 8) for any header names and values,
  CR/LF refused in any name or value on every path, the pool's own fields never taken from the caller.
- ``UpstreamPool.send_idle``: a request on an idle connection is written at once (no coroutine); with no
  idle connection it writes nothing; a refused head takes no connection; a kept-alive connection the
  replica closed under the request is retried once on a new one by ``open_upstream``; a noisy idle
  connection is never used."""
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.proxy import UpstreamFailure, make_session, open_upstream
from gateway.upstream_head import RequestHeads
from gateway.upstream_pool import UpstreamPool

BODY = json.dumps({"id": "x", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(BODY) + BODY
URL = "http://127.0.0.1:8123/v1/completions"
HANG_UP = b"<hang up>"  # a reply ending so: its bytes, then the replica closes the connection


def _head_field_by_field(method: str, headers: dict[str, str], body_len: int) -> bytes:
    """The head as the pool wrote it before any template (session 7), for ``URL`` and the identity default."""
    fields = {"accept-encoding": ("Accept-Encoding", "identity")}
    for k, v in headers.items():
        fields[k.lower()] = (k, v)
    for own in ("host", "content-length", "transfer-encoding"):
        fields.pop(own, None)
    lines = [f"{method} /v1/completions HTTP/1.1", "Host: 127.0.0.1:8123"]
    lines.extend(f"{k}: {v}" for k, v in fields.values())
    lines.append(f"Content-Length: {body_len}")
    return "\r\n".join(lines).encode("latin-1") + b"\r\n\r\n"


_NAME = st.text(alphabet="ABCXYZabcxyz-_%0123456789", min_size=1, max_size=12)
_VALUE = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF), max_size=24)
_SPECIAL = st.sampled_from(["Host", "content-LENGTH", "Accept-Encoding", "Transfer-Encoding", "X-Request-Id",
                            "x-request-id", "traceparent", "Content-Type"])


@settings(max_examples=300, deadline=None)
@given(headers=st.dictionaries(_NAME | _SPECIAL, _VALUE, max_size=6), body_len=st.integers(0, 10**9),
       method=st.sampled_from(["POST", "GET"]))
def test_template_head_equals_the_field_by_field_head(headers: dict[str, str], body_len: int, method: str) -> None:
    heads = RequestHeads({"Accept-Encoding": "identity"})
    want = _head_field_by_field(method, headers, body_len)
    # first call makes the templates, the next ones use them; another value set under the same names too
    assert heads.head(method, URL, headers, body_len) == want
    assert heads.head(method, URL, headers, body_len) == want
    assert heads.general(method, URL, headers, body_len) == want
    other = {k: v[::-1] for k, v in headers.items()}
    assert heads.head(method, URL, other, body_len + 1) == _head_field_by_field(method, other, body_len + 1)


_BAD = st.text(alphabet="ab:%\r\n", min_size=1, max_size=8).filter(lambda s: "\r" in s or "\n" in s)


@settings(max_examples=200, deadline=None)
@given(good=st.dictionaries(_NAME, _VALUE, max_size=3), bad=_BAD, where=st.sampled_from(["name", "value"]))
def test_cr_or_lf_anywhere_is_refused_also_after_the_template_exists(good: dict[str, str], bad: str,
                                                                      where: str) -> None:
    heads = RequestHeads({"Accept-Encoding": "identity"})
    headers = {**good, "X-Request-Id": "ok"}
    heads.head("POST", URL, headers, 2)  # the templates exist (names and target)
    evil = {**headers, "X-Request-Id": bad} if where == "value" else {**headers, bad: "v"}
    with pytest.raises(ValueError):
        heads.head("POST", URL, evil, 2)
    with pytest.raises(ValueError):  # not latin-1
        heads.head("POST", URL, {**headers, "X-Request-Id": "caf\u20ac"}, 2)


def test_the_pools_own_fields_never_come_from_the_caller() -> None:
    heads = RequestHeads({"Accept-Encoding": "identity"})
    for _ in range(2):
        head = heads.head("POST", URL, {"Host": "evil", "content-length": "99", "Transfer-Encoding": "chunked",
                                         "X-Request-Id": "r"}, 3)
        assert head == (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:8123\r\nAccept-Encoding: identity\r\n"
                        b"X-Request-Id: r\r\nContent-Length: 3\r\n\r\n")


@pytest.fixture
async def replica() -> AsyncIterator[Callable[[Callable[[int, int], bytes | None]], Awaitable[tuple[str, list]]]]:
    """A raw replica: per request (connection no., request no. on it) ``reply`` gives the answer's bytes
    (None: hang up without answering). Returns its URL and the list of (connection no., head) it read."""
    servers: list[asyncio.base_events.Server] = []

    async def start(reply: Callable[[int, int], bytes | None]) -> tuple[str, list]:
        seen: list[tuple[int, bytes]] = []
        conns = [0]

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conns[0] += 1
            no, n = conns[0], 0
            try:
                while True:
                    try:
                        head = await reader.readuntil(b"\r\n\r\n")
                    except (asyncio.IncompleteReadError, ConnectionError):
                        return
                    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                                   if line.lower().startswith(b"content-length:")), 0)
                    await reader.readexactly(length)
                    n += 1
                    seen.append((no, head))
                    data = reply(no, n)
                    if data is None:
                        return
                    writer.write(data.removesuffix(HANG_UP))
                    await writer.drain()
                    if data.endswith(HANG_UP):
                        return
            finally:
                writer.close()

        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(srv)
        return f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}", seen

    yield start
    for srv in servers:
        srv.close()


async def _call(pool: UpstreamPool, url: str) -> bytes:
    up = await open_upstream(pool, url + "/v1/completions", {"prompt": "p"}, {"X-Request-Id": "r"}, 5.0)
    try:
        return up.first_chunk + await up.read_rest()
    finally:
        up.close()


async def test_send_idle_writes_on_the_idle_connection_at_once(replica) -> None:
    url, seen = await replica(lambda c, n: OK)
    pool = make_session(4, 2.0, 5.0)
    try:
        assert pool.send_idle("POST", url + "/x", b"{}") is None  # nothing open yet: nothing written
        assert await _call(pool, url) == BODY
        assert pool.idle_connections == 1
        resp = pool.send_idle("POST", url + "/v1/completions", b"{}", {"X-Request-Id": "r2"})
        assert resp is not None and pool.idle_connections == 0  # written, no await in between
        await resp.wait_head()
        assert resp.status == 200 and await resp.read_chunk() == BODY
        resp.close()
        assert [c for c, _ in seen] == [1, 1]
        assert seen[1][1].startswith(b"POST /v1/completions HTTP/1.1\r\n") and b"X-Request-Id: r2\r\n" in seen[1][1]
        assert pool.send_idle("POST", "http://127.0.0.1:1/x", b"{}") is None  # another origin: none idle there
    finally:
        await pool.close()


async def test_a_refused_head_takes_no_idle_connection(replica) -> None:
    url, seen = await replica(lambda c, n: OK)
    pool = make_session(4, 2.0, 5.0)
    try:
        assert await _call(pool, url) == BODY
        with pytest.raises(ValueError):
            pool.send_idle("POST", url + "/x", b"{}", {"X-Request-Id": "a\r\nX-Evil: 1"})
        assert pool.idle_connections == 1 and pool.open_connections == 1
        assert await _call(pool, url) == BODY
        assert len(seen) == 2 and all(b"X-Evil" not in h for _, h in seen)
    finally:
        await pool.close()


async def test_a_kept_alive_connection_closed_under_the_request_is_retried_once_on_a_new_one(replica) -> None:
    url, seen = await replica(lambda c, n: None if (c, n) == (1, 2) else OK)
    pool = make_session(4, 2.0, 5.0)
    try:
        assert await _call(pool, url) == BODY
        assert await _call(pool, url) == BODY  # written on connection 1 (send_idle), hung up, sent on 2
        assert [c for c, _ in seen] == [1, 1, 2]
    finally:
        await pool.close()


async def test_a_reused_connection_closed_after_some_answer_bytes_is_not_retried(replica) -> None:
    url, seen = await replica(lambda c, n: OK if n == 1 else b"HTTP/1.1 200 OK\r\n" + HANG_UP)
    pool = make_session(4, 2.0, 5.0)
    try:
        assert await _call(pool, url) == BODY
        with pytest.raises(UpstreamFailure) as ei:
            await _call(pool, url)
        assert ei.value.kind == "connect" and ei.value.reached
        assert len(seen) == 2  # the replica had begun to answer: never sent twice
        assert pool.open_connections == 0
    finally:
        await pool.close()


async def test_open_upstream_writes_before_it_returns_when_a_connection_is_idle(replica) -> None:
    url, seen = await replica(lambda c, n: OK)
    pool = make_session(4, 2.0, 5.0)
    try:
        first = open_upstream(pool, url + "/v1/completions", {"prompt": "p"}, {"X-Request-Id": "r1"}, 5.0)
        assert pool.open_connections == 0  # nothing idle: written when awaited (a new connection first)
        up = await first
        assert up.first_chunk == BODY
        up.close()
        call = open_upstream(pool, url + "/v1/completions", {"prompt": "p"}, {"X-Request-Id": "r2"}, 5.0)
        assert pool.idle_connections == 0 and pool.open_connections == 1  # taken and written, nothing awaited
        up = await call
        assert up.first_chunk == BODY
        up.close()
        with pytest.raises(RuntimeError):  # awaited once: never sent twice
            await call
        assert [c for c, _ in seen] == [1, 1] and b"X-Request-Id: r2\r\n" in seen[1][1]
        assert b"Content-Type: application/json\r\n" in seen[1][1]
    finally:
        await pool.close()


async def test_a_written_call_cancelled_before_its_answer_aborts_its_connection(replica) -> None:
    url, seen = await replica(lambda c, n: OK if n == 1 else b"")  # the second request is read, never answered
    pool = make_session(4, 2.0, 5.0)
    try:
        assert await _call(pool, url) == BODY
        task = asyncio.ensure_future(_call(pool, url))
        async with asyncio.timeout(5):
            while len(seen) < 2:
                await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert pool.open_connections == 0 and pool.deadlines_pending == 0
    finally:
        await pool.close()
