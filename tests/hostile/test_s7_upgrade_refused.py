"""Review R7-1 (request smuggling through ``Upgrade``) and R7-3 (``#`` in the request-target).

Before the fix, under the default httptools parser, a request with ``Connection: Upgrade`` +
``Upgrade: <anything>`` and a ``Content-Length`` body had its body parsed as a NEW request on the
same connection: 2 requests sent, 3 answered, the smuggled one authenticated, served and audited
on its own. Now, under BOTH parsers and on BOTH listeners, over real loopback sockets, any head
with an ``Upgrade`` field is answered 400 ``upgrade_not_supported`` with ``Connection: close``,
the connection closes, nothing reaches the app (the smuggled request neither), and the refusal
is audited once (endpoint ``http_guard``). Sent in one write, with the body in a later write, and
with the ``Upgrade`` field name split across writes. A ``#`` in the request-target answers 400
``invalid_request_target`` likewise. Unit cases of :class:`gateway.upgrade_guard.HeadScan` cut
every head at every offset.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gateway.app import build_admin_app, build_public_app
from gateway.server import uvicorn_config
from gateway.protocol_audit import attach, refusals_of
from gateway.upgrade_guard import TARGET_CODE, UPGRADE_CODE, HeadScan
from tests.hostile.test_i10_header_limits import (  # noqa: F401 - config_overrides: fixture
    LISTENERS, PARSERS, Listener, _parse_responses, _recording, close, config_overrides, read_one_response,
    read_until_closed)
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.listeners import serving

params = pytest.mark.parametrize("which", LISTENERS)
parsers = pytest.mark.parametrize("parser", PARSERS)
CHAT = {"model": "sim-model", "max_tokens": 4, "messages": [{"role": "user", "content": "SMUGGLED"}]}
#: the smuggled request of each listener (a request the app would serve), and the route of the outer one
INNER = {"public": ("POST", "/v1/chat/completions"), "admin": ("GET", "/admin/replicas")}


@pytest.fixture
async def start(stack: Any) -> AsyncIterator[Callable[..., Awaitable[Listener]]]:
    """``await start(parser, which)``: a fresh listener on 127.0.0.1:0 whose guard refusals are audited."""
    c = stack.components
    async with serving() as serve:
        async def _start(parser: str, which: str) -> Listener:
            reached: list[str] = []
            app = build_public_app(c, manage_lifecycle=False) if which == "public" else build_admin_app(c)
            audited = attach(_recording(app, reached), refusals_of(app))  # the app's refusal audit, kept
            addr = await serve(uvicorn_config(audited, "127.0.0.1", 0, http=parser, limits=c.config.limits))
            return Listener(addr, INNER[which][1], reached)

        yield _start


def request(method: str, path: str, headers: dict[str, str], body: bytes = b"", extra: str = "") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: gateway.test"] + [f"{k}: {v}" for k, v in headers.items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n" + extra + "\r\n").encode() + body


def smuggling_pair(stack: Any, which: str, upgrade: str = "websocket") -> tuple[bytes, bytes]:
    """(the outer request hiding a complete second request in its body, a plain request after it)."""
    auth = stack.auth("tenant-a/app") if which == "public" else {}
    method, path = INNER[which]
    inner = request(method, path, auth, json.dumps(CHAT).encode() if method == "POST" else b"")
    outer = request("POST", INNER[which][1], {**auth, "Connection": "Upgrade", "Upgrade": upgrade}, inner)
    return outer, request("GET", "/healthz" if which == "public" else path, auth)


async def exchange(addr: tuple[str, int], pieces: list[bytes]) -> tuple[bytes, bool]:
    """Send ``pieces`` as separate writes (each drained), then read until the server closes."""
    reader, writer = await asyncio.open_connection(*addr)
    try:
        for i, piece in enumerate(pieces):
            try:
                writer.write(piece)
                await writer.drain()
            except ConnectionError:
                break
            if i < len(pieces) - 1:
                await asyncio.sleep(0.05)  # separate reads on the server side (not a wait for a condition)
        return await read_until_closed(reader)
    finally:
        await close(writer)


def assert_refused_once(data: bytes, closed: bool, code: str) -> None:
    assert closed, "the connection stayed open after the refusal"
    responses = _parse_responses(data)
    assert [r.status for r in responses] == [400], [r.status for r in responses]  # before R7-1: 3 answers
    assert responses[0].headers["connection"] == ["close"]
    assert responses[0].json()["error"]["code"] == code


def guard_events(log: ListLog) -> list[Any]:
    return [e for e in log.events if getattr(e, "endpoint", None) is not None]


@parsers
@params
@pytest.mark.parametrize("split", ["one_write", "body_later", "name_split"])
async def test_upgrade_smuggling_is_refused_before_any_parse(start: Any, stack: Any, audit_log: ListLog,
                                                            parser: str, which: str, split: str) -> None:
    lst = await start(parser, which)
    outer, after = smuggling_pair(stack, which)
    if split == "one_write":
        pieces = [outer + after]
    elif split == "body_later":
        cut = outer.index(b"\r\n\r\n") + 4
        pieces = [outer[:cut], outer[cut:] + after]
    else:
        cut = outer.index(b"Upgrade: websocket") + 3  # "Upg" | "rade: websocket ..."
        pieces = [outer[:cut], outer[cut:] + after]
    data, closed = await exchange(lst.addr, pieces)
    assert_refused_once(data, closed, UPGRADE_CODE)
    assert lst.reached == []  # neither the outer nor the smuggled request reached the app
    events = guard_events(audit_log)
    assert [(e.endpoint, e.status_code, e.error_code, e.outcome.value) for e in events] == [
        ("http_guard", 400, UPGRADE_CODE, "rejected")]
    assert events[0].client_address == "127.0.0.1"


@parsers
@pytest.mark.parametrize("upgrade", ["h2c", "foo", "websocket"])
async def test_any_upgrade_value_and_a_later_request_on_a_used_connection(start: Any, stack: Any, audit_log: ListLog,
                                                                          parser: str, upgrade: str) -> None:
    lst = await start(parser, "public")
    outer, after = smuggling_pair(stack, "public", upgrade)
    reader, writer = await asyncio.open_connection(*lst.addr)
    try:
        writer.write(after)  # a plain request first: the upgrade comes on a connection already used
        await writer.drain()
        first = await read_one_response(reader)
        writer.write(outer.replace(b"Upgrade:", b"upgrade  :") if upgrade == "foo" else outer)
        await writer.drain()
        data, closed = await read_until_closed(reader)
    finally:
        await close(writer)
    assert first.status == 200
    assert_refused_once(data, closed, UPGRADE_CODE)
    assert lst.reached == ["/healthz"]


@parsers
@pytest.mark.parametrize("first", ["bodiless", "with_body"])
async def test_upgrade_pipelined_in_the_same_write_is_not_smuggled(start: Any, stack: Any, audit_log: ListLog,
                                                                   parser: str, first: str) -> None:
    """A head pipelined behind another request in the same read may reach the parser unscanned (behind a
    body; under h11 behind any request): the backstops (httptools' upgrade flag, h11's Request event) refuse it."""
    lst = await start(parser, "public")
    outer, after = smuggling_pair(stack, "public")
    front = request("GET", "/healthz", {}) if first == "bodiless" else request("POST", "/healthz", {}, b"{}")
    data, closed = await exchange(lst.addr, [front + outer + after])
    statuses = [r.status for r in _parse_responses(data)]
    assert closed
    assert lst.reached == ["/healthz"]  # neither the upgrade request nor the one in its body reached the app
    # every answer in order, the refusal last (R7b-2: under httptools a head behind a body used to lose
    # the first answer)
    assert statuses == [200 if first == "bodiless" else 405, 400]
    assert [e.error_code for e in guard_events(audit_log) if e.endpoint == "http_guard"] == [UPGRADE_CODE]


@parsers
@params
@pytest.mark.parametrize("target", ["{p}#x", "{p}?a=1#", "{p}#"])
async def test_fragment_in_the_target_answers_400(start: Any, stack: Any, audit_log: ListLog, parser: str,
                                                  which: str, target: str) -> None:
    lst = await start(parser, which)
    method, path = INNER[which]
    auth = stack.auth("tenant-a/app") if which == "public" else {}
    req = request(method, target.format(p=path), auth, json.dumps(CHAT).encode() if method == "POST" else b"")
    data, closed = await exchange(lst.addr, [req + request("GET", path, auth)])
    assert_refused_once(data, closed, TARGET_CODE)  # before R7-3: served as the route
    assert lst.reached == []
    assert [e.error_code for e in guard_events(audit_log)] == [TARGET_CODE]


HEADS = [
    (b"\r\nPOST /v1/x HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n", UPGRADE_CODE),
    (b"GET / HTTP/1.1\r\nHost: a\r\nuPgRaDe\t: x\r\n\r\n", UPGRADE_CODE),
    (b"GET / HTTP/1.1\nUpgrade:x\n\n", UPGRADE_CODE),
    (b"\r\n\r\nGET /a#b HTTP/1.1\r\nHost: a\r\n\r\n", TARGET_CODE),
    (b"GET /a?q=1 HTTP/1.1\r\nHost: a\r\nX-Note: #upgrade: no\r\nX-Upgrade: 1\r\nUpgraded: 1\r\n\r\n", None),
    (b"GET / HTTP/1.1\r\nHost: a\r\nX: a\r\n upgrade: folded, not a field\r\n\r\n", None),
]


@pytest.mark.parametrize("head,code", HEADS)
def test_head_scan_finds_it_at_every_split(head: bytes, code: str | None) -> None:
    for cut in range(len(head) + 1):
        for cut2 in (cut, min(len(head), cut + 1), min(len(head), cut + 5)):
            scan = HeadScan()
            found = scan.feed(head[:cut]) or scan.feed(head[cut:cut2]) or scan.feed(head[cut2:])
            assert found == code, (cut, cut2)
    scan = HeadScan()
    assert [c for b in head if (c := scan.feed(bytes([b])))][:1] == ([code] if code else [])
