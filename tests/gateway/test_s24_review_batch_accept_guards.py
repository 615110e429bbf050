"""S24 review: the listener guards of gateway/http_guard.py hold for connections the batch accept
(gateway/accept_batch.py, session 23) hands over with ``connect_accepted_socket``: the per-source cap
(``server.max_connections_per_source``: one more connection from the same source gets the JSON 503
``too_many_connections`` before any byte is read) and the head deadline (``limits.header_read_timeout_s``:
a connection that sends half a head gets 408 ``header_timeout`` and is closed). Both run in the protocol's
``connection_made``; these tests run the gateway's uvicorn listener on :class:`BatchAcceptLoop` and on uvloop's
own loop and expect the same answers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

import pytest
import uvicorn
import uvloop
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.accept_batch import BatchAcceptLoop, BatchAcceptServer
from gateway.config_http import LimitsConfig
from gateway.server import uvicorn_config


async def _ok(request: object) -> PlainTextResponse:
    return PlainTextResponse("ok")


APP = Starlette(routes=[Route("/", _ok)])
LOOPS = {"batch": BatchAcceptLoop, "uvloop": uvloop.new_event_loop}


def _read_all(c: socket.socket) -> bytes:
    out = b""
    while chunk := c.recv(65536):
        out += chunk
    return out


def _serve(loop_factory: Callable[[], asyncio.AbstractEventLoop], limits: LimitsConfig, per_source: int | None,
           client: Callable[[int], object]) -> object:
    """Run the gateway's listener config on ``loop_factory``'s loop; ``client(port)`` runs in a thread."""

    async def main() -> object:
        config = uvicorn_config(APP, "127.0.0.1", 0, limits=limits, max_connections_per_source=per_source,
                                date_header=False, loop="none")
        server = uvicorn.Server(config)
        task = asyncio.ensure_future(server.serve())
        try:
            async with asyncio.timeout(10):
                while not server.started:
                    await asyncio.sleep(0.01)
            # the listener under test is the batch server on BatchAcceptLoop, uvloop's own otherwise
            assert isinstance(server.servers[0], BatchAcceptServer) is (loop_factory is BatchAcceptLoop)
            port = server.servers[0].sockets[0].getsockname()[1]
            return await asyncio.get_running_loop().run_in_executor(None, client, port)
        finally:
            server.should_exit = True
            await task

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main())


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_per_source_cap_holds_on_batch_accepted_connections(loop: str) -> None:
    def client(port: int) -> tuple[bytes, bytes]:
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
        try:
            # the two held connections are counted once the server answered on them
            for c in held:
                c.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                assert c.recv(65536).startswith(b"HTTP/1.1 200")
            with socket.create_connection(("127.0.0.1", port), timeout=10) as third:
                refused = _read_all(third)
            held[0].sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
            still = held[0].recv(65536)
            return refused, still
        finally:
            for c in held:
                c.close()

    refused, still = _serve(LOOPS[loop], LimitsConfig(), 2, client)  # type: ignore[misc]
    assert refused.startswith(b"HTTP/1.1 503") and b"too_many_connections" in refused
    assert still.startswith(b"HTTP/1.1 200")  # the connections within the cap are served


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_head_deadline_holds_on_batch_accepted_connections(loop: str) -> None:
    def client(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
            c.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n")  # half a head, then nothing
            return _read_all(c)  # returns once the server closes

    answer = _serve(LOOPS[loop], LimitsConfig(header_read_timeout_s=0.3), None, client)
    assert isinstance(answer, bytes) and answer.startswith(b"HTTP/1.1 408") and b"header_timeout" in answer
