"""Session 7, R6b-2: a replica's late stray answer on a kept-alive upstream connection must never be
read as the next request's answer (that request may be another tenant's).

Against a raw loopback replica (the scripted server of test_s6_upstream_client, on both event loops):
- a stray answer that arrives after the next request was sent and echoes the previous request's
  ``X-Request-Id``: refused (protocol failure, the connection closed), not handed over;
- stray bytes already waiting unread in the socket when the pool takes the idle connection (the
  loop has not read them yet): the connection is discarded and the request goes on a new one.
Before the fix both requests got the stray answer's body.
"""
from __future__ import annotations

import asyncio
import json
import select

import pytest

from gateway.proxy import UpstreamFailure, make_session, open_upstream
from gateway.upstream_conn import UpstreamProtocolError
from gateway.upstream_pool import UpstreamPool
from tests.gateway.test_s6_upstream_client import event_loop_policy, ok, serve  # noqa: F401 - fixtures

pytestmark = pytest.mark.filterwarnings("ignore:Overriding the \"event_loop_policy\" fixture:DeprecationWarning")

STRAY = json.dumps({"id": "stray", "choices": [{"text": "another tenant's answer"}]}).encode()
REAL = json.dumps({"id": "real", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}).encode()


def _rid(head: bytes) -> bytes:
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"x-request-id:"):
            return line.split(b":", 1)[1].strip()
    return b""


async def _body(pool: UpstreamPool, url: str, rid: str) -> bytes:
    resp = await pool.request("POST", url, b"{}", {"X-Request-Id": rid})
    try:
        parts = []
        while chunk := await resp.read_chunk():
            parts.append(chunk)
        return b"".join(parts)
    finally:
        resp.close()


async def test_a_stray_answer_echoing_the_previous_request_id_is_refused(serve) -> None:  # noqa: F811
    previous: list[bytes] = []

    async def reply(conn: int, n: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        rid = _rid(head)
        if n == 2:  # first the late duplicate of the previous answer, then this request's own
            w.write(ok(STRAY, b"X-Request-Id: %s\r\n" % previous[-1]))
        w.write(ok(REAL, b"X-Request-Id: %s\r\n" % rid))
        previous.append(rid)
        return True

    rep = await serve(reply)
    pool = make_session(4, 2.0, 5.0)
    try:
        url = rep.url + "/v1/completions"
        assert await _body(pool, url, "req-1") == REAL
        with pytest.raises(UpstreamProtocolError, match="X-Request-Id"):
            await _body(pool, url, "req-2")  # before: STRAY
        assert await _body(pool, url, "req-3") == REAL  # on a new connection
        assert rep.connections == 2
        # through the pipeline's call: a protocol failure (retried on another replica), never a 200
        with pytest.raises(UpstreamFailure) as failure:
            await open_upstream(pool, url, {"prompt": "p"}, {"X-Request-Id": "req-4"}, 5.0)
        assert failure.value.kind == "protocol"
    finally:
        await pool.close()


async def test_an_answer_without_an_echo_or_with_the_right_one_is_kept(serve) -> None:  # noqa: F811
    async def reply(conn: int, n: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(ok(REAL, b"X-Request-Id: %s\r\n" % _rid(head)) if n % 2 else ok(REAL))
        return True

    rep = await serve(reply)
    pool = make_session(4, 2.0, 5.0)
    try:
        for i in range(4):
            assert await _body(pool, rep.url + "/v1/completions", f"req-{i}") == REAL
        assert rep.connections == 1  # kept alive throughout
    finally:
        await pool.close()


async def test_unread_bytes_waiting_when_the_connection_is_taken_discard_it(serve) -> None:  # noqa: F811
    writers: list[asyncio.StreamWriter] = []

    async def reply(conn: int, n: int, head: bytes, w: asyncio.StreamWriter) -> bool:
        w.write(ok(REAL))
        writers.append(w)
        return True

    rep = await serve(reply)
    pool = make_session(4, 2.0, 5.0)
    try:
        url = rep.url + "/v1/completions"
        assert await _body(pool, url, "req-1") == REAL
        [idle] = [c for q in pool._idle.values() for c in q]
        # the replica sends a stray answer (no echo) while the connection is idle; wait (blocking the
        # loop, so it cannot read them first) until the bytes wait in the gateway's socket
        writers[0].write(ok(STRAY))
        poller = select.poll()
        poller.register(idle.transport.get_extra_info("socket").fileno(), select.POLLIN)
        assert poller.poll(5000), "the stray bytes never arrived"
        assert await _body(pool, url, "req-2") == REAL  # before: STRAY
        assert rep.connections == 2
    finally:
        await pool.close()
