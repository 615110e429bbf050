"""Review R5b-2 / R5b-3: early answers no longer parse the rest of a large body, and chunk framing
bytes count, under BOTH HTTP parsers and on BOTH listeners (real sockets).

- R5b-2: an answer made before the body is read (401 here) is sent once the body's wire bytes
  pass ``limits.max_drain_bytes``, with ``Connection: close``; the connection then closes
  *lingering* (gateway/lingering.py): the client can read the answer while it is still
  sending, the rest is discarded unparsed, and the connection ends when the client closes
  its side, after ``lingering_close_s`` or past ``lingering_close_bytes``. Before: the guard
  parsed up to 8 MiB (one parser callback and ASGI message per chunk) before answering.
- R5b-3: chunk-size lines with extensions are counted: as wire bytes against the drain cap,
  and in total (more than ``max_header_bytes`` + 32 bytes per chunk answers 400
  ``chunk_framing_too_large``). Before: 16 KB of extension per 1 KiB chunk was read without bound.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.http_guard import guarded_protocol
from tests.hostile.test_i10_header_limits import (
    DEADLINE_S, LISTENERS, PARSERS, close, read_one_response, read_until_closed, start,  # noqa: F401 - fixture
)
from tests.hostile.test_s5_body_framing import BODY_PATHS, chunked_head, chunks, code_of

DRAIN = 16 * 1024  # limits.max_drain_bytes in these tests
HEADER = 8192  # limits.max_header_bytes

parsers = pytest.mark.parametrize("parser", PARSERS)
listeners = pytest.mark.parametrize("which", LISTENERS)


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    # body_read_timeout_s far above DEADLINE_S: before R5b-2 the drain waited for the body until then
    return {"limits": {"max_header_bytes": HEADER, "header_read_timeout_s": 5.0, "body_read_timeout_s": 60.0,
                       "max_drain_bytes": DRAIN}}


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


@parsers
@listeners
async def test_answer_readable_while_the_body_still_arrives_then_lingering_ends(start, parser, which):
    """128 KiB of an unfinished chunked body (8 x the drain cap): the 401 arrives at once with
    ``Connection: close``, and the server closes ``lingering_close_s`` later with nothing more sent."""
    lst = await start(parser, which, lingering_close_s=0.3)
    reader, writer = await asyncio.open_connection(*lst.addr)
    try:
        await _send(writer, chunked_head(BODY_PATHS[which]) + chunks(128, 1024))
        resp = await read_one_response(reader)  # before R5b-2: nothing until the body ends (or 60 s)
        assert resp.status == 401
        assert resp.headers["connection"] == ["close"]
        rest, closed = await read_until_closed(reader)
        assert closed and rest == b""
    finally:
        await close(writer)


@parsers
async def test_client_keeps_sending_after_the_answer_then_half_close_ends_the_lingering(start, parser):
    """After the 401 the client sends 1 MiB more (discarded; a socket closed at once would answer it
    with a reset), then closes its side: the server's side ends cleanly (EOF, no reset)."""
    lst = await start(parser, "public", lingering_close_s=3600.0)
    reader, writer = await asyncio.open_connection(*lst.addr)
    try:
        await _send(writer, chunked_head(BODY_PATHS["public"]) + chunks(64, 1024))
        assert (await read_one_response(reader)).status == 401
        for _ in range(16):
            await _send(writer, chunks(64, 1024))
        writer.write_eof()
        async with asyncio.timeout(DEADLINE_S):
            assert await reader.read() == b""  # ConnectionResetError if the server had not lingered
    finally:
        await close(writer)


@parsers
async def test_lingering_discards_at_most_its_byte_bound(start, parser):
    """Past ``lingering_close_bytes`` of discarded bytes the server closes (the client's writes then
    fail), long before a 256 MiB body is sent."""
    lst = await start(parser, "public", lingering_close_s=3600.0, lingering_close_bytes=256 * 1024)
    reader, writer = await asyncio.open_connection(*lst.addr)
    block = chunks(64, 1024)
    sent = 0
    try:
        await _send(writer, chunked_head(BODY_PATHS["public"]) + block)
        assert (await read_one_response(reader)).status == 401
        with pytest.raises(ConnectionError):
            async with asyncio.timeout(DEADLINE_S * 3):
                while sent < (256 << 20):
                    await _send(writer, block)
                    sent += len(block)
    finally:
        await close(writer)
    assert sent < (256 << 20)


@parsers
async def test_parsed_drain_is_bounded_and_an_uploading_client_reads_the_answer(stack, parser):
    """A client that sends a whole 4 MiB body in 1 KiB chunks before reading still reads the 401,
    while the parser saw only about the drain cap of it (before R5b-2: all 4 MiB, 4,096 callbacks)."""
    from gateway.app import build_public_app
    from gateway.server import uvicorn_config
    from tests.support.listeners import serving

    parsed: list[int] = []
    c = stack.components
    limits = c.config.limits
    base = guarded_protocol(parser, max_header_bytes=limits.max_header_bytes)

    class Counting(base):  # type: ignore[misc, valid-type]
        def guard_parse(self, data: bytes) -> None:
            if not self.guard_waiting:
                parsed.append(len(data))
            super().guard_parse(data)

    async with serving() as serve:
        addr = await serve(uvicorn_config(build_public_app(c, manage_lifecycle=False), "127.0.0.1", 0,
                                          http=Counting, limits=limits))
        reader, writer = await asyncio.open_connection(*addr)
        try:
            await _send(writer, chunked_head("/v1/chat/completions") + chunks(4096, 1024) + b"0\r\n\r\n")
            resp = await read_one_response(reader)
        finally:
            await close(writer)
    assert resp.status == 401 and resp.headers["connection"] == ["close"]
    assert sum(parsed) < 1 << 20, sum(parsed)


@parsers
@listeners
async def test_chunk_extensions_count_as_framing(start, parser, which):
    """Two 1 KiB chunks, each with a 5,000-byte extension (under the per-line bound, the body's wire
    under the drain cap): the framing passes ``max_header_bytes`` + 32 per chunk -> 400
    ``chunk_framing_too_large`` at once (before: read on, the 401 only once the body ends)."""
    lst = await start(parser, which)
    ext = b";e=" + b"v" * 4997
    body = b"".join(b"400%s\r\n%s\r\n" % (ext, b"x" * 1024) for _ in range(2))
    reader, writer = await asyncio.open_connection(*lst.addr)
    try:
        await _send(writer, chunked_head(BODY_PATHS[which]) + body)
        resp = await read_one_response(reader)
        _, closed = await read_until_closed(reader)
    finally:
        await close(writer)
    assert resp.status == 400 and code_of(resp) == "chunk_framing_too_large"
    assert closed


@parsers
@listeners
async def test_drain_cap_counts_framing_bytes(start, parser, which):
    """12 KiB of payload (under the 16 KiB drain cap) behind a 7,000-byte chunk extension (within
    the framing bound): 19 KiB of wire, so the 401 comes at once with ``Connection: close``
    (before: the drain counted only the payload and waited for the rest of the body)."""
    lst = await start(parser, which)
    first = b"400;e=" + b"v" * 6994 + b"\r\n" + b"x" * 1024 + b"\r\n"
    reader, writer = await asyncio.open_connection(*lst.addr)
    try:
        await _send(writer, chunked_head(BODY_PATHS[which]) + first + chunks(11, 1024))
        resp = await read_one_response(reader)
        assert resp.status == 401 and resp.headers["connection"] == ["close"]
    finally:
        await close(writer)


@parsers
async def test_small_refused_body_still_drained_and_connection_kept(start, parser):
    """Under the drain cap nothing changes: the 401 follows the body and the connection serves the next request."""
    lst = await start(parser, "public")
    reader, writer = await asyncio.open_connection(*lst.addr)
    try:
        await _send(writer, chunked_head(BODY_PATHS["public"]) + chunks(8, 1024) + b"0\r\n\r\n"
                    + b"GET /healthz HTTP/1.1\r\nHost: gateway.test\r\n\r\n")
        first = await read_one_response(reader)
        second = await read_one_response(reader)
    finally:
        await close(writer)
    assert first.status == 401 and "close" not in first.headers.get("connection", [])
    assert second.status == 200
