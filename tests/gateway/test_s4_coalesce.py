"""Session 4 (issue 14): the server connection's writes within one loop step leave as one
write (gateway/coalesce.py), in order; close flushes first, abort drops, a closing transport
gets nothing; and a real answer through the guarded protocol arrives whole."""
from __future__ import annotations

import asyncio
from typing import Any

from gateway.coalesce import CoalescingTransport


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closing = False
        self.closed = self.aborted = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = self.closed = True

    def abort(self) -> None:
        self.closing = self.aborted = True

    def write_eof(self) -> None:
        self.writes.append(b"<eof>")

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 1) if name == "peername" else default


async def _step() -> None:
    await asyncio.sleep(0)


async def test_a_held_write_leaves_with_the_next_one_or_at_the_end_of_the_step() -> None:
    raw = _Transport()
    t = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert raw.writes == [] and t.get_write_buffer_size() == 7 + 19  # held
    t.write(bytearray(b"ab"))  # session 10: held too, until the answer is complete or the step ends
    assert raw.writes == [] and t.get_write_buffer_size() == 7 + 21
    t.flush()  # the answer is complete (gateway/http_guard.py): both leave now, as one
    assert raw.writes == [b"HTTP/1.1 200 OK\r\n\r\nab"]
    t.writelines([b"cd"])
    assert len(raw.writes) == 1
    await _step()  # nothing else in this step: it leaves alone, at the end of the step
    assert raw.writes == [b"HTTP/1.1 200 OK\r\n\r\nab", b"cd"]
    await _step()
    assert len(raw.writes) == 2
    from gateway.coalesce import FLUSH_AT
    t.write(b"x" * FLUSH_AT)  # as much as uvicorn's high-water mark: out at once
    assert raw.writes[-1] == b"x" * FLUSH_AT and t.get_write_buffer_size() == 7
    assert t.get_extra_info("peername") == ("127.0.0.1", 1)  # delegated


async def test_close_and_write_eof_flush_first_abort_drops() -> None:
    raw = _Transport()
    t = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"x")
    t.write_eof()
    t.write(b"body")
    t.close()
    assert raw.writes == [b"x", b"<eof>", b"body"] and raw.closed
    await _step()
    assert raw.writes == [b"x", b"<eof>", b"body"]  # the scheduled flush finds nothing
    raw2 = _Transport()
    t2 = CoalescingTransport(raw2, asyncio.get_running_loop())  # type: ignore[arg-type]
    t2.write(b"lost")
    t2.abort()
    await _step()
    assert raw2.writes == [] and raw2.aborted


async def test_nothing_is_written_to_a_closing_transport() -> None:
    raw = _Transport()
    t = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    t.write(b"a")
    raw.closing = True  # e.g. the connection was lost meanwhile
    t.write(b"b")
    await _step()
    assert raw.writes == []


async def test_a_plain_answer_leaves_the_guarded_server_in_one_send(monkeypatch) -> None:
    import gateway.head_guard as head_guard  # connection_made lives there since session 9
    from gateway.server import uvicorn_config
    from tests.support.listeners import serving

    flushed: list[bytes] = []

    class Spy(CoalescingTransport):
        __slots__ = ()

        def flush(self) -> None:
            if self._pending:
                flushed.append(b"".join(self._pending))
            super().flush()

    monkeypatch.setattr(head_guard, "CoalescingTransport", Spy)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
        await send({"type": "http.response.body", "body": b"hello"})

    async with serving() as serve:
        host, port = await serve(uvicorn_config(app, "127.0.0.1", 0, http="httptools"))
        reader, writer = await asyncio.open_connection(host, port)
        for _ in range(2):  # keep-alive: each answer one write
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200") and await asyncio.wait_for(reader.readexactly(5), 5) == b"hello"
        writer.close()
    assert len(flushed) == 2 and all(f.startswith(b"HTTP/1.1 200") and f.endswith(b"\r\n\r\nhello") for f in flushed)
