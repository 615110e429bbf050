"""Session 7, issue 14 (HTTP edge): no per-request timer where the bytes are already there.

- A request head read whole in one socket read arms no head-read timer (the connection's first
  period, from ``connection_made``, is the only one); a head that arrives in pieces still does, and
  is still answered 408 when it does not complete in time (under both parsers).
- ``read_body`` on the httptools listener: when the protocol holds the whole body by the time the
  app reads it (:data:`gateway.body_guard.BODY_COMPLETE_KEY`), no ``asyncio.timeout`` is entered;
  a body still arriving is read under the timeout as before (and cut off with 408 when it stops);
  the size cap holds on both paths (a chunked body over the cap answers 413).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.requests import Request

import gateway.body_read as request_mod  # read_body's module since session 23
from gateway.body_guard import BODY_COMPLETE_KEY
from gateway.errors import GatewayError
from gateway.http_guard import guarded_protocol
from gateway.request import read_body
from gateway.server import uvicorn_config
from tests.hostile.test_i10_header_limits import read_one_response, read_until_closed
from tests.hostile.test_i10_http_framing import _parse_responses
from tests.support.listeners import serving

MAX_BODY = 1000
BODY_TIMEOUT_S = 0.5


class _Counted:
    """Stands in for gateway/body_read.py's ``asyncio`` module: counts its ``timeout`` entries."""

    def __init__(self) -> None:
        self.n = 0

    def timeout(self, delay: float | None) -> Any:
        self.n += 1
        return asyncio.timeout(delay)

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)


async def _echo_body(scope: Any, receive: Any, send: Any) -> None:
    """ASGI app: 200 with the body ``read_body`` returned, else the GatewayError's status and code."""
    if scope["type"] != "http":
        return
    try:
        body = await read_body(Request(scope, receive), MAX_BODY, BODY_TIMEOUT_S)
        status, out = 200, body
    except GatewayError as err:
        status, out = err.status, err.code.encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(out)).encode())]})
    await send({"type": "http.response.body", "body": out})


@contextlib.asynccontextmanager
async def _listener(parser: str, protocol: Any = None) -> AsyncIterator[tuple[str, int]]:
    async with serving() as serve:
        kw: dict[str, Any] = {"http": protocol} if protocol is not None else {"http": parser}
        yield await serve(uvicorn_config(_echo_body, "127.0.0.1", 0, **kw))


def _post(body: bytes, *, head_only: bool = False) -> bytes:
    head = b"POST /x HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(body)
    return head if head_only else head + body


@pytest.mark.parametrize("parser", ["h11", "httptools"])
async def test_whole_heads_arm_no_timer_partial_heads_do(parser: str) -> None:
    base = guarded_protocol(parser, header_read_timeout_s=0.5)
    starts: list[int] = []

    class Counting(base):  # type: ignore[misc, valid-type]
        def guard_start_timer(self) -> None:
            starts.append(1)
            super().guard_start_timer()

    async with _listener(parser, Counting) as addr:
        reader, writer = await asyncio.open_connection(*addr)
        try:
            for i in range(3):  # keep-alive requests, each head and body in one write
                writer.write(_post(b"hello %d" % i))
                resp = await read_one_response(reader)
                assert (resp.status, resp.body) == (200, b"hello %d" % i)
            assert len(starts) == 1, "only the connection's first period (connection_made) arms a timer"
            writer.write(b"POST /x HTTP/1.1\r\nHost: t\r\n")  # a head in pieces: timed, then 408
            data, closed = await read_until_closed(reader)
        finally:
            writer.close()
    assert closed
    assert [r.status for r in _parse_responses(data)] == [408]
    assert len(starts) >= 2


async def test_whole_body_is_read_without_a_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    counted = _Counted()
    monkeypatch.setattr(request_mod, "asyncio", counted)
    async with _listener("httptools") as addr:
        reader, writer = await asyncio.open_connection(*addr)
        try:
            writer.write(_post(b'{"a": 1}'))
            resp = await read_one_response(reader)
            assert (resp.status, resp.body, counted.n) == (200, b'{"a": 1}', 0)
            # the head first, the body later: the app reads under the timeout, as before
            writer.write(_post(b"late body", head_only=True))
            await writer.drain()
            await asyncio.sleep(0.05)  # the app is waiting for the body now (not asserting on time)
            writer.write(b"late body")
            resp = await read_one_response(reader)
            assert (resp.status, resp.body, counted.n) == (200, b"late body", 1)
            # a body that stops short is still cut off by the timeout
            writer.write(_post(b"0123456789")[:-3])
            resp = await read_one_response(reader)
            assert (resp.status, resp.body) == (408, b"body_timeout")
        finally:
            writer.close()


async def test_whole_chunked_body_over_the_cap_is_refused() -> None:
    big = b"x" * (MAX_BODY + 1)
    chunked = (b"POST /x HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
               + b"%x\r\n" % len(big) + big + b"\r\n0\r\n\r\n")
    async with _listener("httptools") as addr:
        reader, writer = await asyncio.open_connection(*addr)
        try:
            writer.write(chunked)
            resp = await read_one_response(reader)
        finally:
            writer.close()
    assert (resp.status, resp.body) == (413, b"body_too_large")


class _Scripted:
    """A ``receive`` returning the given messages in order."""

    def __init__(self, *messages: dict[str, Any]) -> None:
        self.messages = list(messages)

    async def __call__(self) -> dict[str, Any]:
        return self.messages.pop(0)


def _request(receive: Any, complete: bool) -> Request:
    scope: dict[str, Any] = {"type": "http", "method": "POST", "headers": [], "path": "/x"}
    if complete:
        scope[BODY_COMPLETE_KEY] = True
    return Request(scope, receive)


@pytest.mark.parametrize("complete", [True, False])
async def test_read_body_results_do_not_depend_on_the_flag(complete: bool) -> None:
    parts = _Scripted({"type": "http.request", "body": b"ab", "more_body": True},
                      {"type": "http.request", "body": b"cd", "more_body": False})
    assert await read_body(_request(parts, complete), MAX_BODY, BODY_TIMEOUT_S) == b"abcd"
    gone = _Scripted({"type": "http.disconnect"})
    with pytest.raises(GatewayError) as err:
        await read_body(_request(gone, complete), MAX_BODY, BODY_TIMEOUT_S)
    assert err.value.code == "client_disconnect"
    whole = _Scripted({"type": "http.request", "body": json.dumps([1] * 600).encode(), "more_body": False})
    with pytest.raises(GatewayError) as err:
        await read_body(_request(whole, complete), MAX_BODY, BODY_TIMEOUT_S)
    assert (err.value.status, err.value.code) == (413, "body_too_large")


class _NoHeaders(Request):
    @property
    def headers(self) -> Any:  # type: ignore[override]
        raise AssertionError("read_body read the headers again")


@pytest.mark.parametrize("declared", [0, 7, MAX_BODY, MAX_BODY + 1])
async def test_read_body_takes_the_framing_guards_plain_length(declared: int) -> None:
    from gateway.body_guard import PLAIN_LENGTH_KEY

    outcomes = []
    for use_key in (False, True):
        scope: dict[str, Any] = {"type": "http", "method": "POST", "path": "/x",
                                 "headers": [(b"content-length", str(declared).encode())]}
        if use_key:
            scope[PLAIN_LENGTH_KEY] = declared
        receive = _Scripted({"type": "http.request", "body": b"x" * min(declared, 7), "more_body": False})
        request = (_NoHeaders if use_key else Request)(scope, receive)
        try:
            outcomes.append(await read_body(request, MAX_BODY, BODY_TIMEOUT_S))
        except GatewayError as err:
            outcomes.append((err.status, err.code, err.headers))
    assert outcomes[0] == outcomes[1]


def test_uvicorn_cycle_attributes_the_body_flag_reads_exist() -> None:
    """``on_message_complete`` reads the cycle's ``scope`` and ``more_body`` (uvicorn's
    RequestResponseCycle); an upgrade that renamed them fails here (the guard then keeps the timer)."""
    import inspect

    from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

    source = inspect.getsource(RequestResponseCycle.__init__)
    assert "self.scope = scope" in source and "self.more_body = True" in source
