"""Session 10 (issue 14, syscalls and wakeups): a warm upstream call makes no running-loop lookup
(each one is a ``getpid`` system call on CPython 3.11), and a complete answer's last write leaves the
guarded listener before the ASGI ``send`` returns (no extra loop round for the chunk terminator),
under both HTTP parsers; the upstream deadline still fires."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

import gateway.head_guard as head_guard
from gateway.client_io import LOSS_KEY, ConnectionLoss, unless_client_leaves
from gateway.coalesce import CoalescingTransport
from gateway.proxy import UpstreamFailure, open_upstream
from gateway.server import uvicorn_config
from gateway.upstream_pool import UpstreamPool
from tests.support.listeners import serving

BODY = b'{"id":"x","usage":{"prompt_tokens":1,"completion_tokens":1}}'
ANSWER = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)


async def _replica(answer: bool = True) -> tuple[asyncio.base_events.Server, str]:
    """A raw keep-alive replica: reads a head and a Content-Length body, answers ``ANSWER`` (or never)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                if answer:
                    writer.write(ANSWER)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}/v1/completions"


async def test_a_warm_upstream_call_looks_up_no_running_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    srv, url = await _replica()
    pool = UpstreamPool(4, 5.0)
    try:
        async def call() -> bytes:
            up = await open_upstream(pool, url, {"prompt": "p"}, {"X-Request-Id": "r"}, 5.0)
            try:
                return up.first_chunk + await up.read_rest()
            finally:
                up.close()

        assert await call() == BODY  # connects (a lookup or two: once per connection)
        lookups = []
        real = asyncio.get_running_loop

        def counting() -> asyncio.AbstractEventLoop:
            lookups.append(1)
            return real()

        monkeypatch.setattr(asyncio, "get_running_loop", counting)
        assert await call() == BODY  # kept alive: the pool's and the connection's loop serve
        monkeypatch.setattr(asyncio, "get_running_loop", real)
        assert lookups == [] and pool.open_connections == 1
        assert pool.time() == pytest.approx(real().time(), abs=0.5)
    finally:
        await pool.close()
        srv.close()


async def test_the_first_byte_deadline_still_fires_and_the_pool_forgets_its_loop_when_empty() -> None:
    srv, url = await _replica(answer=False)
    pool = UpstreamPool(4, 5.0)
    try:
        with pytest.raises(UpstreamFailure) as err:
            await asyncio.wait_for(open_upstream(pool, url, {"prompt": "p"}, {}, 0.05), 5)
        assert err.value.kind == "timeout"
        assert pool.open_connections == 0 and pool.deadlines_pending == 0  # aborted, never reused
        assert pool.time() == pytest.approx(asyncio.get_running_loop().time(), abs=0.5)
    finally:
        await pool.close()
        srv.close()


async def test_unless_client_leaves_notes_the_connection_loop_and_still_cancels_on_loss() -> None:
    loss = ConnectionLoss()

    class Req:
        scope = {LOSS_KEY: loss}

    assert await unless_client_leaves(Req(), asyncio.sleep(0, "done")) == "done"  # type: ignore[arg-type]
    assert loss.loop is asyncio.get_running_loop()
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.sleep(30)

    call = asyncio.ensure_future(unless_client_leaves(Req(), work()))  # type: ignore[arg-type]
    await asyncio.wait_for(started.wait(), 5)
    loss.fire()
    from gateway.client_io import ClientGone
    with pytest.raises(ClientGone):
        await asyncio.wait_for(call, 5)


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_a_complete_answer_leaves_before_send_returns(parser: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed answer (head, a part, the end) written in one step: when the last ``send`` returns,
    nothing is held back in the coalescing transport (before session 10 the chunk terminator waited
    for the end of the loop step), and it left in one write (before: two)."""
    transports: list[Any] = []
    raw_writes: list[bytes] = []

    class Spy(CoalescingTransport):
        __slots__ = ()

        def __init__(self, transport: Any, loop: Any) -> None:
            super().__init__(transport, loop)
            transports.append(self)

        def flush(self) -> None:
            if self._pending:
                raw_writes.append(b"".join(self._pending))
            super().flush()

    monkeypatch.setattr(head_guard, "CoalescingTransport", Spy)
    held_after_end: list[int] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        held_after_end.append(transports[-1].get_write_buffer_size() - transports[-1].transport.get_write_buffer_size())

    async with serving() as serve:
        host, port = await serve(uvicorn_config(app, "127.0.0.1", 0, http=parser))
        reader, writer = await asyncio.open_connection(host, port)
        for _ in range(2):
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5) == b"9\r\ndata: 1\n\n\r\n0\r\n\r\n"
        writer.close()
    assert held_after_end == [0, 0]
    # one write per answer: head, part and terminator together (two before session 10, the second a loop round later)
    assert len(raw_writes) == 2 and all(w.startswith(b"HTTP/1.1 200") and w.endswith(b"\r\n0\r\n\r\n")
                                        for w in raw_writes), raw_writes


async def test_a_read_deadline_lowered_after_a_longer_read_fires_at_its_own_bound() -> None:
    """write_stall.py lowers ``timeout_s`` between sends (rate budget, max_stream_s): the timer set for an
    earlier, longer bound must not make the shorter one fire late (before session 10 it fired at the old bound)."""
    from gateway.read_deadline import ReadDeadline

    d = ReadDeadline(30.0)
    assert await d.read(asyncio.sleep(0, "first")) == "first"  # timer set for ~30 s from now
    d.timeout_s = 0.05
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(d.read(loop.create_future()), 5)  # would wait ~30 s, or wait_for's 5 s, before
    assert loop.time() - t0 < 2.0
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
    d.close()


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_a_live_streams_first_part_leaves_while_the_answer_waits_for_more(parser: str) -> None:
    """Held writes leave at the end of their step: the client gets the head and the first part while the
    app waits (for the client itself here: without that flush this would never end)."""
    got_first = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await asyncio.wait_for(got_first.wait(), 5)
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": False})

    async with serving() as serve:
        host, port = await serve(uvicorn_config(app, "127.0.0.1", 0, http=parser))
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
        await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert await asyncio.wait_for(reader.readuntil(b"data: 1\n\n\r\n"), 5) == b"9\r\ndata: 1\n\n\r\n"
        got_first.set()
        assert await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5) == b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"
        writer.close()
