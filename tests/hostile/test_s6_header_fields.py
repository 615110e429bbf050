"""Review R6-3: a bound on the number of header fields of a request head (``limits.max_header_fields``).

Under BOTH parsers and on BOTH listeners, over real loopback sockets (the listeners and helpers of
tests/hostile/test_i10_header_limits.py): a head of more fields than the bound answers 431
``too_many_header_fields`` with ``Connection: close``, the connection closes and nothing reaches the
app (before session 6: served, however many fields fit in ``max_header_bytes``); a head of exactly
the bound is served, also when sent one byte at a time; fields are counted per head (pipelined heads
of the bound each, in one write, are all served) and a body's line feeds are never counted.
Unit cases of :class:`gateway.head_fields.HeadFields` cover pieces split inside the blank line.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.head_fields import HeadFields
from tests.hostile.test_i10_header_limits import (  # noqa: F401 - start, config_overrides: fixtures
    LISTENERS, PARSERS, _parse_responses, close, config_overrides, read_one_response, read_until_closed, start)

MAXF = 20
params = pytest.mark.parametrize("which", LISTENERS)
parsers = pytest.mark.parametrize("parser", PARSERS)


def head_with_fields(path: str, fields: int, method: str = "GET", extra: bytes = b"") -> bytes:
    """A request head of exactly ``fields`` header fields (``Host`` included)."""
    lines = [f"{method} {path} HTTP/1.1", "Host: gateway.test"] + [f"a{i}: b" for i in range(fields - 1)]
    return ("\r\n".join(lines) + "\r\n").encode() + extra + b"\r\n"


@parsers
@params
async def test_head_over_the_field_bound_answers_431_and_closes(start: Any, parser: str, which: str) -> None:
    lst = await start(parser, which, max_header_fields=MAXF)
    reader, writer = await asyncio.open_connection(*lst.addr)
    try:
        writer.write(head_with_fields(lst.path, MAXF + 1) + head_with_fields(lst.path, 2))
        await writer.drain()
        data, closed = await read_until_closed(reader)
    finally:
        await close(writer)
    assert closed, "the connection stayed open after a head of too many fields"
    responses = _parse_responses(data)
    assert [r.status for r in responses] == [431]  # before R6-3's fix: 200/401, then the pipelined one
    assert responses[0].headers["connection"] == ["close"]
    assert responses[0].json()["error"]["code"] == "too_many_header_fields"
    assert lst.reached == []


@parsers
@params
async def test_heads_at_the_bound_are_served_per_head_and_bodies_do_not_count(start: Any, parser: str,
                                                                              which: str) -> None:
    lst = await start(parser, which, max_header_fields=MAXF)
    body = b"{" + b"\r\n" * 200 + b"}"  # line feeds in a body are not header fields
    post = head_with_fields(lst.path, MAXF, "POST", f"Content-Length: {len(body)}\r\n".encode())
    reader, writer = await asyncio.open_connection(*lst.addr)
    try:
        writer.write(head_with_fields(lst.path, MAXF) * 3 + post.replace(b"a0: b\r\n", b"", 1) + body
                     + head_with_fields(lst.path, MAXF))
        await writer.drain()
        statuses = [(await read_one_response(reader)).status for _ in range(5)]
    finally:
        await close(writer)
    ok = 200 if which == "public" else 401
    assert statuses[:3] == [ok] * 3 and statuses[4] == ok
    assert statuses[3] in (405, 401)  # POST to a GET route: the app answered, not the guard
    assert lst.reached == [lst.path] * 5


@parsers
async def test_head_at_the_bound_trickled_byte_by_byte_is_served(start: Any, parser: str) -> None:
    lst = await start(parser, "public", max_header_fields=MAXF)
    reader, writer = await asyncio.open_connection(*lst.addr)
    try:
        for b in head_with_fields(lst.path, MAXF):
            writer.write(bytes([b]))
            await writer.drain()
        resp = await read_one_response(reader)
        for b in head_with_fields(lst.path, MAXF + 1):  # the next head, one field too many
            writer.write(bytes([b]))
            await writer.drain()
        data, closed = await read_until_closed(reader)
    except ConnectionError:  # refused mid-trickle: the server closed while we were writing
        data, closed = b"", True
    finally:
        await close(writer)
    assert resp.status == 200
    assert closed
    assert all(r.status == 431 for r in _parse_responses(data))
    assert lst.reached == [lst.path]


def test_counter_pieces_blank_line_split_and_leading_blank_lines() -> None:
    head = b"\r\n\r\nGET / HTTP/1.1\r\nHost: x\r\na: b\r\n\r\nBODY\r\n\r\n\r\n"
    for cut in range(1, len(head)):  # any split: 2 fields, the body's lines never counted
        c = HeadFields(2)
        assert c.feed(head[:cut]) and c.feed(head[cut:]) and c.lines == 4 and c.ended, cut
        c = HeadFields(1)
        assert not (c.feed(head[:cut]) and c.feed(head[cut:])), cut
    c = HeadFields(3)
    assert c.feed(b"GET / HTTP/1.1\nA: 1\nB: 2\nC: 3\n") and not c.feed(b"D: 4\n")  # LF-only lines too
    c.reset()
    assert c.feed(b"GET / HTTP/1.1\nA: 1\n\n") and c.ended
