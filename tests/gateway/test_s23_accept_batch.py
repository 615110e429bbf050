"""Session 23 (issue 14, helper azure): uvloop listeners accept every waiting connection per wake-up.

libuv >= 1.45 accepts one connection per loop iteration; on a saturated gateway new connections waited
seconds in the kernel's accept queue (bench/results/azure-s23-*.md). :class:`BatchAcceptLoop` serves plain
TCP servers with :class:`BatchAcceptServer`. These tests show the old behaviour (uvloop's own server: one
accept per iteration), the new one, that a client gets the same bytes from the gateway's listener on
either loop, and the server's edges (bind errors, close, running out of descriptors, other servers).
"""

from __future__ import annotations

import asyncio
import errno
import socket
import threading
from collections.abc import Callable
from typing import Any

import pytest
import uvicorn
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gateway import accept_batch
from gateway.accept_batch import BatchAcceptLoop, BatchAcceptServer, bind_tcp
from gateway.server import run_serving, uvicorn_config

BURST = 40


class _Count(asyncio.Protocol):
    made: list[asyncio.BaseTransport] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        type(self).made.append(transport)


def _accepted_within(loop_factory: Callable[[], asyncio.AbstractEventLoop], iterations: int) -> int:
    """Connections accepted of a burst of :data:`BURST` already waiting, within ``iterations`` loop steps."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        made: list[asyncio.BaseTransport] = []
        proto = type("P", (_Count,), {"made": made})
        server = await loop.create_server(proto, "127.0.0.1", 0, backlog=256)
        port = server.sockets[0].getsockname()[1]
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(BURST)]  # handshakes: the kernel's
        try:
            for _ in range(iterations):
                await asyncio.sleep(0)
            return len(made)
        finally:
            for c in clients:
                c.close()
            server.close()
            await server.wait_closed()
            for t in made:
                t.close()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main())


def test_uvloops_own_server_accepts_one_connection_per_iteration() -> None:
    # the behaviour this session works around (libuv PR #3696): a burst waits for as many iterations
    assert _accepted_within(uvloop.new_event_loop, 10) <= 12 < BURST


def test_the_batch_server_accepts_a_waiting_burst_in_a_few_iterations() -> None:
    assert _accepted_within(BatchAcceptLoop, 10) == BURST


def test_run_serving_runs_on_the_batch_accept_loop() -> None:
    async def which() -> type:
        return type(asyncio.get_running_loop())

    assert issubclass(run_serving(which()), BatchAcceptLoop)
    # a worker whose public socket is shared with the other workers keeps libuv's one accept per iteration
    shared = run_serving(which(), batch_accept=False)
    assert issubclass(shared, uvloop.Loop) and not issubclass(shared, BatchAcceptLoop)


# --- the gateway's listener (uvicorn with the guarded protocol) gives the same bytes on either loop

async def _plain(request: Request) -> JSONResponse:
    body = await request.body()
    return JSONResponse({"path": request.url.path, "n": len(body), "q": request.query_params.get("q")})


async def _stream(request: Request) -> StreamingResponse:
    n = int(request.query_params.get("n", "3"))

    async def parts():  # type: ignore[no-untyped-def]
        for i in range(n):
            yield f"data: {{\"i\": {i}}}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(parts(), media_type="text/event-stream")


APP = Starlette(routes=[Route("/plain", _plain, methods=["POST"]), Route("/stream", _stream)])


def _exchange(loop_factory: Callable[[], asyncio.AbstractEventLoop], raw_requests: list[bytes],
              use_sock: bool) -> list[bytes]:
    """Each raw request on its own connection to uvicorn (the gateway's config: guarded protocol,
    httptools) on a loop of ``loop_factory``; every answer's bytes (the connection closed by the request)."""

    async def main() -> list[bytes]:
        config = uvicorn_config(APP, "127.0.0.1", 0, date_header=False, loop="none")
        server = uvicorn.Server(config)
        sock = None
        if use_sock:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
        task = asyncio.ensure_future(server.serve(sockets=[sock] if sock is not None else None))
        try:
            async with asyncio.timeout(10):
                while not server.started:
                    await asyncio.sleep(0.01)
            port = server.servers[0].sockets[0].getsockname()[1]
            loop = asyncio.get_running_loop()

            def talk(raw: bytes) -> bytes:
                with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                    c.sendall(raw)
                    out = b""
                    while chunk := c.recv(65536):
                        out += chunk
                    return out

            return [await loop.run_in_executor(None, talk, r) for r in raw_requests]
        finally:
            server.should_exit = True
            await task
            if sock is not None:
                sock.close()

    with asyncio.Runner(loop_factory=loop_factory) as runner:
        return runner.run(main())


def _requests(body: bytes, q: str, n: int) -> list[bytes]:
    return [
        b"POST /plain?q=" + q.encode() + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: "
        + str(len(body)).encode() + b"\r\n\r\n" + body,
        b"GET /stream?n=" + str(n).encode() + b" HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        b"GET /nowhere HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        b"NOT HTTP AT ALL\r\n\r\n",
    ]


@settings(max_examples=8, deadline=None)
@given(body=st.binary(max_size=2048), q=st.text(alphabet="abcxyz019", max_size=12), n=st.integers(0, 20),
       use_sock=st.booleans())
def test_the_listener_answers_the_same_bytes_on_the_batch_loop_as_on_uvloops(body: bytes, q: str, n: int,
                                                                              use_sock: bool) -> None:
    raw = _requests(body, q, n)
    assert _exchange(BatchAcceptLoop, raw, use_sock) == _exchange(uvloop.new_event_loop, raw, use_sock)


# --- edges

def test_bind_error_names_the_address() -> None:
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(OSError) as info:
            bind_tcp("127.0.0.1", port, 16)
        assert info.value.errno == errno.EADDRINUSE and str(port) in str(info.value)
    finally:
        taken.close()


def test_a_closed_server_refuses_new_connections() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0)
        assert isinstance(server, BatchAcceptServer) and server.is_serving() and server.get_loop() is loop
        port = server.sockets[0].getsockname()[1]
        server.close()
        server.close()  # idempotent
        await server.wait_closed()
        assert not server.is_serving() and server.sockets == ()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()

    with asyncio.Runner(loop_factory=BatchAcceptLoop) as runner:
        runner.run(main())


def test_other_servers_are_uvloops_own(tmp_path: Any) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        unix = await loop.create_unix_server(asyncio.Protocol, str(tmp_path / "s.sock"))
        opts = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, reuse_address=True)
        try:
            assert not isinstance(unix, BatchAcceptServer) and not isinstance(opts, BatchAcceptServer)
        finally:
            for s in (unix, opts):
                s.close()
                await s.wait_closed()

    with asyncio.Runner(loop_factory=BatchAcceptLoop) as runner:
        runner.run(main())


def test_a_tls_listener_is_refused() -> None:
    # the gateway serves no TLS (docs/security.md; tests/security/test_s19_tls_clients.py): the loop says so
    import ssl as ssl_module

    async def main() -> None:
        ctx = ssl_module.SSLContext(ssl_module.PROTOCOL_TLS_SERVER)
        with pytest.raises(ValueError, match="no TLS"):
            await asyncio.get_running_loop().create_server(asyncio.Protocol, "127.0.0.1", 0, ssl=ctx)

    with asyncio.Runner(loop_factory=BatchAcceptLoop) as runner:
        runner.run(main())


class _OutOfFiles(socket.socket):
    failures = 1

    def accept(self) -> tuple[socket.socket, Any]:  # type: ignore[override]
        if type(self).failures:
            type(self).failures -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return super().accept()


def test_out_of_descriptors_pauses_accepting_then_resumes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(accept_batch, "ACCEPT_RETRY_DELAY_S", 0.05)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        made: list[asyncio.BaseTransport] = []
        proto = type("P", (_Count,), {"made": made})
        sock = _OutOfFiles(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        server = BatchAcceptServer(loop, proto, [sock], 16)
        client = socket.create_connection(sock.getsockname())
        try:
            async with asyncio.timeout(10):
                while not made:
                    await asyncio.sleep(0.01)
            assert _OutOfFiles.failures == 0 and len(made) == 1
        finally:
            client.close()
            server.close()
            for t in made:
                t.close()

    with asyncio.Runner(loop_factory=BatchAcceptLoop) as runner:
        runner.run(main())


def test_a_connection_that_cannot_be_handed_over_is_closed() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()

        def broken() -> asyncio.Protocol:
            raise RuntimeError("no protocol")

        server = await loop.create_server(broken, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        done = threading.Event()
        got: list[bytes] = []

        def client() -> None:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
                got.append(c.recv(1))  # b"": closed by the server
            done.set()

        th = threading.Thread(target=client)
        th.start()
        async with asyncio.timeout(10):
            while not done.is_set():
                await asyncio.sleep(0.01)
        th.join()
        server.close()
        await server.wait_closed()
        assert got == [b""]

    with asyncio.Runner(loop_factory=BatchAcceptLoop) as runner:
        runner.run(main())
