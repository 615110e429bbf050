"""Session 29 (S29-audit29): ``SyslogSink.send`` to a TCP peer that stopped reading fails within its timeout.

``send`` waits for the socket (bounded) only when the kernel did not take the whole batch (session 29: no
``wait_for`` task and timer per batch otherwise). Found on the way: once the bounded wait ran out, dropping
the connection waited for ``wait_closed()``, which never comes while unsent bytes sit in the transport and
the peer does not read: ``send`` hung for good, so that sink's delivery task never took anything again
(its events spilled until the spill limit shut the gateway's door), even after the peer came back. The
connection is now aborted when closing it does not finish within the sink's timeout.
"""
from __future__ import annotations

import asyncio
import socket

import pytest

from audit.event import AuditEvent, Kind, Outcome
from audit.sink import SinkUnavailable
from audit.syslog import SyslogSink


@pytest.mark.timeout(60)
async def test_syslog_send_to_a_peer_that_stopped_reading_fails_instead_of_hanging() -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # small window (inherited on accept)
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    accepted: list[socket.socket] = []
    loop = asyncio.get_running_loop()
    srv.setblocking(False)
    accept = asyncio.ensure_future(loop.sock_accept(srv))
    sink = SyslogSink("127.0.0.1", srv.getsockname()[1], "tcp", connect_timeout_s=0.1, linger_s=0.0)
    got = bytearray()

    async def read_all(conn: socket.socket) -> None:
        conn.setblocking(False)
        while data := await loop.sock_recv(conn, 1 << 16):
            got.extend(data)

    try:
        await sink.open()
        conn, _ = await accept
        accepted.append(conn)  # never read
        batch = [AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"r{i}", tenant="t",
                            endpoint="/v1/" + "x" * 2000) for i in range(200)]
        with pytest.raises(SinkUnavailable):  # not a hang (pytest-timeout above)
            for _ in range(500):  # ~0.45 MB a send: the socket buffers fill, then a send must wait and fail
                await sink.send(batch)
        # the peer comes back (a new connection that reads): the same sink delivers again
        accepted.pop().close()
        accept = asyncio.ensure_future(loop.sock_accept(srv))
        done = asyncio.Event()

        async def serve() -> None:
            conn, _ = await accept
            accepted.append(conn)
            await read_all(conn)
            done.set()

        server = asyncio.ensure_future(serve())
        await sink.send([AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id="back", tenant="t")])
        await sink.close()
        await asyncio.wait_for(done.wait(), 30)
        await server
        assert b"back" in bytes(got)
    finally:
        await sink.close()
        for c in accepted:
            c.close()
        srv.close()
