"""Scripted replicas for the issue 12 ledger and SSE tests: exact bytes, resets, stalls.

A :class:`Scripted` runs ``n`` tiny aiohttp replicas (``/health`` answers
200). An inference call is answered by the script named by the first word of
its prompt (``prompt: "<script> w0 w1 ..."``); scripts are the functions in
:data:`SCRIPTS` below, each getting the replica state, the request and the
parsed body. Replicas count the calls they got (``hits``).

Also :class:`CapturingLog`, an audit log that keeps every event it is given
(the real :class:`audit.event.AuditEvent` the gateway built).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.audit_log import ListLog

USAGE_20_7 = {"prompt_tokens": 20, "completion_tokens": 7, "total_tokens": 27}


def chunk_obj(text: str, *, usage: dict[str, Any] | None = None, choices: bool = True) -> dict[str, Any]:
    """A streamed ``text_completion`` chunk (no choices: the usage-only chunk)."""
    obj: dict[str, Any] = {"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "sim-model",
                           "choices": [{"index": 0, "text": text, "finish_reason": None}] if choices else []}
    if usage is not None:
        obj["usage"] = usage
    return obj


def event(obj: dict[str, Any], *, space: bool = True, eol: bytes = b"\n") -> bytes:
    """One SSE event: ``data: <json>`` (or ``data:<json>``) and a blank line, with ``eol`` line ends."""
    return b"data:" + (b" " if space else b"") + json.dumps(obj, separators=(",", ":")).encode() + eol + eol


def odd_stream(eol: bytes) -> bytes:
    """The report's stream: ``eol`` line endings, ``data:{`` without a space, ``: ping``
    comments, three content chunks, a usage chunk of 20 prompt / 7 completion tokens."""
    return (b": ping" + eol + eol
            + event(chunk_obj(" one"), space=False, eol=eol)
            + b": ping" + eol + eol
            + event(chunk_obj(" two"), eol=eol)
            + event(chunk_obj(" three"), space=False, eol=eol)
            + event(chunk_obj("", usage=USAGE_20_7, choices=False), space=False, eol=eol)
            + b"data: [DONE]" + eol + eol)


TWO_CHUNKS = event(chunk_obj(" a")) + event(chunk_obj(" b"))


@dataclass
class Replica:
    """One scripted replica's state."""

    index: int
    hits: int = 0
    url: str = ""
    runner: web.AppRunner | None = None


@dataclass
class Scripted:
    """``n`` scripted replicas; ``release``: an event the ``hold`` scripts wait for;
    ``cut``: an event the ``reset2`` script waits for before resetting its connection;
    ``resets_left``: how many ``reset0`` calls still get a reset before any byte."""

    replicas: list[Replica] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    cut: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    resets_left: int = 1
    stream_bytes: bytes = b""

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def hits(self) -> int:
        return sum(r.hits for r in self.replicas)


def _rst(request: web.Request) -> None:
    """Reset the connection (TCP RST: SO_LINGER 0, then abort)."""
    transport = request.transport
    assert transport is not None
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


async def _sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp


async def s_usage(s: Scripted, rep: Replica, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """Plain or streamed answer with usage 20 / 7."""
    if body.get("stream"):
        resp = await _sse(request)
        await resp.write(odd_stream(b"\n"))
        await resp.write_eof()
        return resp
    return web.json_response({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "sim-model",
                              "choices": [{"index": 0, "text": " one two", "finish_reason": "stop"}],
                              "usage": USAGE_20_7})


async def s_nousage(s: Scripted, rep: Replica, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """Plain answer without usage, or a stream of three content chunks without a usage chunk."""
    if body.get("stream"):
        resp = await _sse(request)
        await resp.write(event(chunk_obj(" a")) + event(chunk_obj(" b")) + event(chunk_obj(" c"))
                         + b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    return web.json_response({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "sim-model",
                              "choices": [{"index": 0, "text": " a b c", "finish_reason": "stop"}]})


async def s_hold(s: Scripted, rep: Replica, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """Wait for ``release``, then answer with usage: the whole prompt count and all of ``max_tokens``."""
    s.in_flight += 1
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(s.release.wait(), 10.0)
    finally:
        s.in_flight -= 1
    used = {"prompt_tokens": 50, "completion_tokens": int(body.get("max_tokens", 1)), "total_tokens": 0}
    return web.json_response({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "sim-model",
                              "choices": [{"index": 0, "text": " x", "finish_reason": "length"}], "usage": used})


async def s_small(s: Scripted, rep: Replica, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """Like ``hold`` but reports 50 prompt / 7 completion tokens (most of the reservation unused)."""
    s.in_flight += 1
    try:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(s.release.wait(), 10.0)
    finally:
        s.in_flight -= 1
    used = {"prompt_tokens": 50, "completion_tokens": 7, "total_tokens": 57}
    return web.json_response({"id": "cmpl-1", "object": "text_completion", "created": 0, "model": "sim-model",
                              "choices": [{"index": 0, "text": " x", "finish_reason": "stop"}], "usage": used})


async def s_fail500(s: Scripted, rep: Replica, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    return web.json_response({"error": {"message": "boom", "type": "server_error"}}, status=500)


async def s_stallfirst(s: Scripted, rep: Replica, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    await asyncio.sleep(30)  # cancelled when the gateway hangs up
    raise web.HTTPServiceUnavailable()


async def s_twothenhold(s: Scripted, rep: Replica, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """Two content chunks, then nothing (the client leaves, or the gateway's read times out)."""
    resp = await _sse(request)
    await resp.write(TWO_CHUNKS)
    await asyncio.sleep(30)
    return resp


async def s_reset2(s: Scripted, rep: Replica, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """Two content chunks; once the test saw them (``cut``), reset the connection."""
    resp = await _sse(request)
    await resp.write(TWO_CHUNKS)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(s.cut.wait(), 5.0)
    _rst(request)
    await asyncio.sleep(30)  # cancelled: the connection is gone
    return resp


async def s_reset0(s: Scripted, rep: Replica, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """The first ``resets_left`` calls: reset before any byte; later calls: a normal stream with usage."""
    if s.resets_left > 0:
        s.resets_left -= 1
        _rst(request)
        await asyncio.sleep(30)
    return await s_usage(s, rep, request, body)


async def s_bytes(s: Scripted, rep: Replica, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    """Stream ``Scripted.stream_bytes`` exactly, in small pieces."""
    resp = await _sse(request)
    data = s.stream_bytes
    for i in range(0, len(data), 7):
        await resp.write(data[i:i + 7])
    await resp.write_eof()
    return resp


SCRIPTS = {f.__name__[2:]: f for f in (s_usage, s_nousage, s_hold, s_small, s_fail500, s_stallfirst,
                                        s_twothenhold, s_reset2, s_reset0, s_bytes)}


def _app(s: Scripted, rep: Replica) -> web.Application:
    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "instance_id": f"scripted-{rep.index}"})

    async def infer(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompt = body.get("prompt")
        if isinstance(prompt, list):
            prompt = prompt[0]
        if prompt is None:
            prompt = body["messages"][-1]["content"]
        name = str(prompt).split(" ", 1)[0]
        rep.hits += 1
        return await SCRIPTS[name](s, rep, request, body)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", infer)
    app.router.add_post("/v1/chat/completions", infer)
    return app


async def start_scripted(n: int) -> Scripted:
    """Start ``n`` scripted replicas on loopback."""
    s = Scripted()
    for i in range(n):
        rep = Replica(i)
        runner = web.AppRunner(_app(s, rep), handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        rep.url, rep.runner = f"http://127.0.0.1:{port}", runner
        s.replicas.append(rep)
    return s


async def stop_scripted(s: Scripted) -> None:
    s.release.set()
    s.cut.set()
    for rep in s.replicas:
        if rep.runner is not None:
            await rep.runner.cleanup()


@contextlib.asynccontextmanager
async def scripted(n: int) -> AsyncIterator[Scripted]:
    s = await start_scripted(n)
    try:
        yield s
    finally:
        await stop_scripted(s)


class CapturingLog(ListLog):
    """A stand-in audit log for :class:`gateway.auditing.AuditHub`: keeps each emitted event."""

    def by_request(self, request_id: str) -> Any:
        found = [e for e in self.events if e.request_id == request_id]
        assert len(found) == 1, f"{len(found)} events for request {request_id}"
        return found[0]
