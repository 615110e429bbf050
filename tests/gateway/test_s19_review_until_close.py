"""Session 19 review: an upstream answer whose body is delimited by the end of the connection (no
``Content-Length``, no chunked coding) must not be taken as complete when the connection ends in an
error (S19-R1: a TCP reset) or, over TLS, without a ``close_notify`` alert (S19-R2). For TLS the
interpreter does not matter: asyncio's and uvloop's SSL transports take the peer's TCP FIN as a clean
end of the TLS stream (asyncio/sslproto.py ``eof_received`` -> ``_do_flush`` -> ``_do_shutdown`` skips
``unwrap`` once EOF was received), so a truncation is never reported on 3.11.2 or 3.11.7, whatever
``OP_IGNORE_UNEXPECTED_EOF`` says (checked: with ``connection_lost`` fixed for ``exc``, the TLS case
still reads complete on both interpreters). Only the framing can tell: refuse an until-close body.

RFC 9112 8: "A client that receives an incomplete response message, which can occur when a
connection is closed prematurely ..., MUST record the message as incomplete." RFC 9112 9.8: "A
response that has neither chunked transfer coding nor Content-Length is complete only if a valid
closure alert has been received. Treating an incomplete message as complete could expose
implementations to attack."

Main (6553416): ``UpstreamConnection.connection_lost`` calls ``resp._finish()`` for an until-close
body whatever ``exc`` is (gateway/upstream_conn.py 212-217), so both cut answers read as complete.

Fixed: a reset fails the answer (``UpstreamConnectionLost``, ``received_any`` true: no retry), and
over TLS an until-close body is always recorded as incomplete, even after a ``close_notify`` (the
transports cannot tell the two ends apart); a plain connection's clean close still completes it.
"""
from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import uvloop

from gateway.upstream_conn import UpstreamConnectionLost
from gateway.upstream_pool import UpstreamPool
from tests.support.tls import self_signed

pytestmark = pytest.mark.filterwarnings("ignore:Overriding the \"event_loop_policy\" fixture:DeprecationWarning")

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n"  # no length: the body ends with the connection
PART = b'{"id":"x","choices":[{"text":"the first half of an ans'


@pytest.fixture(params=["asyncio", "uvloop"], scope="module")
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Both loops: the gateway serves on uvloop, other tests use asyncio's."""
    return uvloop.EventLoopPolicy() if request.param == "uvloop" else asyncio.DefaultEventLoopPolicy()


Cut = Callable[[asyncio.StreamWriter], None]


def reset(writer: asyncio.StreamWriter) -> None:
    """End the connection with a TCP RST (SO_LINGER 0, then close)."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


def no_close_notify(writer: asyncio.StreamWriter) -> None:
    """End a TLS connection without its closure alert: abort() closes the socket, no close_notify."""
    writer.transport.abort()


@pytest.fixture
async def replica(tmp_path: Path) -> AsyncIterator[Callable[[Cut, bool], Awaitable[tuple[str, asyncio.Event]]]]:
    servers: list[asyncio.base_events.Server] = []

    async def start(cut: Cut, tls: bool) -> tuple[str, asyncio.Event]:
        go = asyncio.Event()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(x.split(b":")[1]) for x in head.split(b"\r\n")
                           if x.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            writer.write(HEAD + PART)
            await writer.drain()
            await go.wait()  # the client read the part: now cut the connection
            cut(writer)

        ctx = None
        if tls:
            cert, key = self_signed(tmp_path)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(cert, key)
        srv = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
        servers.append(srv)
        scheme = "https" if tls else "http"
        return f"{scheme}://127.0.0.1:{srv.sockets[0].getsockname()[1]}", go

    yield start
    for srv in servers:
        srv.close()


async def _read_cut_answer(url: str, go: asyncio.Event) -> None:
    """Read the answer up to the cut, then once more: raises what the pool reports after the cut."""
    pool = UpstreamPool(2, 5.0)  # the production client: no context given, the interpreter's defaults
    try:
        resp = await pool.request("POST", url + "/v1/completions", b"{}")
        assert resp.status == 200
        got = b""
        async with asyncio.timeout(10):  # a bound against a hang, not a timed assertion
            while len(got) < len(PART):
                got += await resp.read_chunk()
            assert got == PART
            go.set()
            rest = await resp.read_chunk()  # main: b"" (complete); expected: UpstreamConnectionLost
        resp.close()
        raise AssertionError(f"a cut answer read as complete (rest {rest!r})")
    finally:
        await pool.close()


async def test_an_until_close_body_cut_by_a_reset_is_not_complete(replica) -> None:
    url, go = await replica(reset, False)
    with pytest.raises(UpstreamConnectionLost) as err:
        await _read_cut_answer(url, go)
    assert err.value.received_any  # after the first byte: the pipeline does not retry


async def test_an_until_close_tls_body_without_close_notify_is_not_complete(replica, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    url, go = await replica(no_close_notify, True)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "cert.pem"))  # the default context's roots: the test CA
    with pytest.raises(UpstreamConnectionLost):
        await _read_cut_answer(url, go)


def clean_close(writer: asyncio.StreamWriter) -> None:
    """End the connection cleanly: FIN (and over TLS, close_notify first)."""
    writer.close()


async def test_an_until_close_tls_body_is_incomplete_even_after_close_notify(replica, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The transports report both ends alike, so a TLS until-close body is never taken as complete."""
    url, go = await replica(clean_close, True)
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "cert.pem"))
    with pytest.raises(UpstreamConnectionLost) as err:
        await _read_cut_answer(url, go)
    assert err.value.received_any  # after the first byte: the pipeline does not retry


async def test_an_until_close_body_ended_cleanly_on_plain_tcp_is_complete(replica) -> None:
    url, go = await replica(clean_close, False)
    with pytest.raises(AssertionError, match="read as complete"):  # RFC 9112 6.3 item 8: the close ends it
        await _read_cut_answer(url, go)
