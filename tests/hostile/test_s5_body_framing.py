"""Review R5-1 / R5-5: chunked request bodies are bounded per chunk and trailers are refused,
under BOTH HTTP parsers and on BOTH listeners, before the app or any authentication.

- a body sent in 1-byte chunks answers 400 ``body_too_fragmented`` and the connection closes
  after at most ``limits.max_body_chunks`` chunks (counted as parser callbacks), instead of
  being drained chunk by chunk before the 401;
- a body in 1 KiB chunks (one per KiB is always allowed) is read as before (the 401 is
  readable and the connection stays usable);
- a trailer field answers 400 ``trailers_not_allowed``; an endless trailer section or one
  huge trailer field is cut long before it is all sent.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from gateway.http_guard import guarded_protocol
from tests.hostile.test_i10_header_limits import (
    DEADLINE_S, LISTENERS, PARSERS, close, read_until_closed, start,  # noqa: F401 - start: a fixture
)
from tests.hostile.test_i10_http_framing import _parse_responses

CHUNKS = 64  # limits.max_body_chunks in these tests
BODY_PATHS = {"public": "/v1/chat/completions", "admin": "/admin/replicas"}  # both 401 without a token

parsers = pytest.mark.parametrize("parser", PARSERS)
listeners = pytest.mark.parametrize("which", LISTENERS)


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    # max_drain_bytes: these bodies (up to 192 KiB) are drained and the connection kept (R5b-2 default: 64 KiB)
    return {"limits": {"max_header_bytes": 8192, "header_read_timeout_s": 5.0, "max_body_chunks": CHUNKS,
                       "max_drain_bytes": 1 << 20}}


def chunked_head(path: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: gateway.test\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n").encode()


def chunks(n: int, size: int) -> bytes:
    return (b"%x\r\n%s\r\n" % (size, b"x" * size)) * n


async def exchange(addr: tuple[str, int], data: bytes) -> tuple[list[Any], bool, int]:
    """Send ``data`` (as far as the server lets us), then read until closed: (responses, closed, bytes sent)."""
    reader, writer = await asyncio.open_connection(*addr)
    sent = 0
    try:
        for i in range(0, len(data), 65536):
            writer.write(data[i:i + 65536])
            await writer.drain()
            sent += len(data[i:i + 65536])
    except ConnectionError:
        pass
    try:
        raw, closed = await read_until_closed(reader, DEADLINE_S)
    finally:
        await close(writer)
    return _parse_responses(raw), closed, sent


def code_of(resp: Any) -> str:
    return json.loads(resp.body)["error"]["code"]


@parsers
@listeners
async def test_one_byte_chunks_refused_400_and_closed(start, parser, which):
    lst = await start(parser, which)
    resps, closed, _ = await exchange(lst.addr, chunked_head(BODY_PATHS[which]) + chunks(5000, 1) + b"0\r\n\r\n")
    assert closed
    assert [r.status for r in resps] == [400]
    assert code_of(resps[0]) == "body_too_fragmented"
    assert resps[0].headers["connection"] == ["close"]


async def test_one_byte_chunks_cost_at_most_the_bound_in_parser_callbacks(stack):
    """httptools: uvicorn's per-chunk ``on_body`` runs at most ``max_body_chunks`` times for a
    body of 5,000 one-byte chunks (before: once per chunk, ~33 ns per wire byte of Python)."""
    from gateway.app import build_public_app
    from gateway.server import uvicorn_config
    from tests.support.listeners import serving

    calls: list[int] = []
    base = guarded_protocol("httptools", max_header_bytes=8192, max_body_chunks=CHUNKS)

    class Counting(base):  # type: ignore[misc, valid-type]
        def on_body(self, body: bytes) -> None:
            calls.append(len(body))
            super().on_body(body)

    c = stack.components
    async with serving() as serve:
        addr = await serve(uvicorn_config(build_public_app(c, manage_lifecycle=False), "127.0.0.1", 0,
                                          http=Counting, limits=c.config.limits))
        resps, closed, _ = await exchange(addr, chunked_head("/v1/chat/completions") + chunks(5000, 1) + b"0\r\n\r\n")
    assert [r.status for r in resps] == [400] and closed
    assert 0 < len(calls) <= CHUNKS


@parsers
async def test_kib_chunks_are_read_as_before(start, parser):
    lst = await start(parser, "public")
    reader, writer = await asyncio.open_connection(*lst.addr)
    try:
        writer.write(chunked_head("/v1/chat/completions") + chunks(3 * CHUNKS, 1024) + b"0\r\n\r\n"
                     + b"GET /healthz HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
        await writer.drain()
        raw = b""
        async with asyncio.timeout(DEADLINE_S):
            while len(_parse_responses(raw)) < 2:
                data = await reader.read(65536)
                assert data, "closed early"
                raw += data
    finally:
        await close(writer)
    assert [r.status for r in _parse_responses(raw)] == [401, 200]  # drained, readable, connection kept


@parsers
@listeners
async def test_trailer_field_refused(start, parser, which):
    lst = await start(parser, which)
    resps, closed, _ = await exchange(lst.addr, chunked_head(BODY_PATHS[which]) + b"2\r\n{}\r\n0\r\nx-t: v\r\n\r\n")
    assert closed
    assert [r.status for r in resps] == [400]
    assert code_of(resps[0]) == "trailers_not_allowed"


@parsers
async def test_endless_trailer_section_cut_early(start, parser):
    lst = await start(parser, "public")
    trailer = b"x-t: v\r\n" * (8 << 20 >> 3)  # 8 MiB of 8-byte trailer lines, never ended
    resps, closed, sent = await exchange(lst.addr, chunked_head("/v1/chat/completions") + b"2\r\n{}\r\n0\r\n" + trailer)
    assert closed
    assert [r.status for r in resps] in ([400], [])  # the 400 may be lost to the reset of our unread writes
    assert sent < len(trailer)  # the server closed long before: nothing buffers the section


@parsers
async def test_one_huge_trailer_field_cut_early(start, parser):
    lst = await start(parser, "public")
    trailer = b"x-t: " + b"v" * (8 << 20)  # one 8 MiB trailer field, never ended
    resps, closed, sent = await exchange(lst.addr, chunked_head("/v1/chat/completions") + b"2\r\n{}\r\n0\r\n" + trailer)
    assert closed
    assert [r.status for r in resps] in ([400], [])  # the 400 may be lost to the reset of our unread writes
    if parser == "httptools" and resps:  # h11 answers its own 400 (incomplete-event bound = max_header_bytes)
        assert code_of(resps[0]) == "chunk_framing_too_large"
    assert sent < len(trailer)


@parsers
async def test_huge_chunk_extension_cut_early(start, parser):
    lst = await start(parser, "public")
    ext = b"1;e=" + b"x" * (8 << 20)  # a chunk-size line that never ends
    resps, closed, sent = await exchange(lst.addr, chunked_head("/v1/chat/completions") + ext)
    assert closed
    assert [r.status for r in resps] in ([400], [])
    assert sent < len(ext)


@parsers
async def test_authenticated_body_refused_mid_read_reaches_the_app_as_the_refusal(stack, start, parser):
    """The app was reading the body when the protocol refused it: its audit/answer code is
    ``body_too_fragmented``, not ``client_disconnect`` (the client gets the protocol's 400)."""
    lst = await start(parser, "public")
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway.test\r\n"
            f"Authorization: Bearer {stack.token()}\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    resps, closed, _ = await exchange(lst.addr, head + chunks(10, 1024) + chunks(5000, 1) + b"0\r\n\r\n")
    assert closed and [r.status for r in resps] == [400]
    assert code_of(resps[0]) == "body_too_fragmented"
