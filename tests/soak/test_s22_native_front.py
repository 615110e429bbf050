"""bench.native_front (session 22, issue 14 sizing): a keep-alive request pair and a chunked answer on
loopback with a trivial ASGI app; bench.overhead keeps the native targets off by default."""

from __future__ import annotations

import asyncio
from typing import Any

from bench import overhead
from bench.native_front import start_front
from gateway.body_guard import BODY_COMPLETE_KEY
from gateway.client_io import LOSS_KEY, ConnectionLoss


async def _echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """``/echo``: the body back with a length; ``/chunks``: two parts without a length (chunked)."""
    message = await receive()
    assert scope["type"] == "http" and scope[BODY_COMPLETE_KEY] is True
    assert isinstance(scope[LOSS_KEY], ConnectionLoss) and scope["client"][0] == "127.0.0.1"
    if scope["path"] == "/echo":
        body = b"%s %s %s" % (scope["method"].encode(), scope["raw_path"], message["body"])
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 201, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b"data: two\n\n", "more_body": True})
    await send({"type": "http.response.body", "body": b""})


async def _read_answer(reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """(status line, header fields (lower-case names), body: by Content-Length or de-chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status, *lines = head[:-4].split(b"\r\n")
    fields = {k.strip().lower(): v.strip() for k, v in (line.split(b":", 1) for line in lines)}
    if b"content-length" in fields:
        return status, fields, await reader.readexactly(int(fields[b"content-length"]))
    assert fields[b"transfer-encoding"] == b"chunked"
    body = b""
    while True:
        size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return status, fields, body
        body += chunk[:-2]


async def test_keep_alive_pair_and_chunked_answer_on_one_connection() -> None:
    server = await start_front(_echo, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for body in (b"first", b"second"):  # the same connection serves both (keep-alive)
            writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            status, fields, got = await _read_answer(reader)
            assert status == b"HTTP/1.1 200 OK" and fields[b"content-type"] == b"text/plain"
            assert got == b"POST /echo " + body and b"connection" not in fields
        writer.write(b"POST /chunks HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n")
        status, fields, got = await _read_answer(reader)
        assert status == b"HTTP/1.1 201 Created" and got == b"data: one\n\ndata: two\n\n"
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nConnection: close\r\n\r\nz")
        status, fields, got = await _read_answer(reader)
        assert got == b"POST /echo z" and fields[b"connection"] == b"close"
        assert await reader.read() == b""  # closed after a Connection: close request
    finally:
        writer.close()
        server.close()


def test_native_targets_are_off_by_default() -> None:
    assert not set(overhead.NATIVE_TARGETS) & set(overhead.TARGET_NAMES)
