"""Review R5-11: uvicorn's "Invalid HTTP request received." is logged once per window with
its source and a count of the repeats, not once per malformed request."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from gateway.log_aggregate import RepeatedLineFilter, note_peer
from gateway.server import uvicorn_config
from tests.support.listeners import serving
from tests.support.waiting import wait_for

MSG = "Invalid HTTP request received."


class Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def logger() -> Any:
    lg = logging.getLogger("test.s5.aggregate")
    cap = Capture()
    lg.addHandler(cap)
    lg.propagate = False
    yield lg, cap
    lg.removeHandler(cap)
    lg.filters.clear()


def test_one_line_per_window_then_a_summary_with_sources(logger):
    lg, cap = logger
    now = [0.0]
    lg.addFilter(RepeatedLineFilter(window_s=10, clock=lambda: now[0]))
    for i in range(1000):
        note_peer((f"10.0.0.{i % 3}", 1000 + i))
        lg.warning(MSG)
    assert len(cap.lines) == 1 and "from 10.0.0.0" in cap.lines[0]
    lg.warning("something else")  # other lines pass untouched
    assert cap.lines[-1] == "something else"
    now[0] = 11.0  # no event loop here: the summary goes out before the next window's first line
    note_peer(("10.0.0.9", 1))
    lg.warning(MSG)
    assert len(cap.lines) == 4
    assert "999 more times" in cap.lines[2] and "10.0.0.0 x333" in cap.lines[2]
    assert "from 10.0.0.9" in cap.lines[3]


async def test_summary_goes_out_at_the_end_of_the_window(logger):
    lg, cap = logger
    lg.addFilter(RepeatedLineFilter(window_s=0.2))
    note_peer(("10.1.1.1", 1))
    for _ in range(50):
        lg.warning(MSG)
    await wait_for(lambda: len(cap.lines) == 2, timeout_s=5, what="window summary")
    assert "49 more times" in cap.lines[1] and "10.1.1.1 x49" in cap.lines[1]


async def uvicorn_lines(stack: Any, app: Any, request: bytes, n: int, answer: bytes) -> list[str]:
    """Send ``request`` ``n`` times, each on a fresh connection, to a uvicorn listener of ``app``
    configured as the gateway's (httptools); each answer starts with ``answer``. The lines
    ``uvicorn.error`` logged meanwhile, through a fresh window of the aggregating filter."""
    cap = Capture()
    uv = logging.getLogger("uvicorn.error")
    try:
        async with serving() as serve:
            addr = await serve(uvicorn_config(app, "127.0.0.1", 0, http="httptools",
                                              limits=stack.components.config.limits))
            uv.addHandler(cap)  # after uvicorn configured its loggers (that drops their handlers)
            for f in uv.filters:  # a fresh window for this test (another test may have used the filter)
                if isinstance(f, RepeatedLineFilter):
                    f._windows.clear()
            for _ in range(n):
                reader, writer = await asyncio.open_connection(*addr)
                writer.write(request)
                await writer.drain()
                assert (await reader.read(200)).startswith(answer)
                writer.close()
    finally:
        uv.removeHandler(cap)
    return cap.lines


async def test_malformed_requests_on_a_listener_log_one_line(stack):
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("never reached")

    # a head the parser refuses (since R8-1 a CONNECT head is refused by the HTTP guard before uvicorn sees it)
    lines = await uvicorn_lines(stack, app, b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n", 50,
                                b"HTTP/1.1 400")
    invalid = [line for line in lines if line.startswith("Invalid HTTP request")]
    assert len(invalid) == 1 and "from 127.0.0.1" in invalid[0]


async def test_websocket_upgrade_requests_log_one_line_of_each_kind(stack):
    """R5b-5: each `Upgrade: websocket` request made uvicorn log two lines (unsupported upgrade,
    no WebSocket library); both were aggregated. Since R7-1 the HTTP guard refuses such a head
    (400 ``upgrade_not_supported``) before uvicorn's parser sees it: uvicorn logs neither."""
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    upgrade_request = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
    lines = await uvicorn_lines(stack, app, upgrade_request, 20, b"HTTP/1.1 400")
    nolib = [line for line in lines if line.startswith("No supported WebSocket")]
    upgrade = [line for line in lines if line.startswith("Unsupported upgrade")]
    assert len(nolib) == 0 and len(upgrade) == 0
