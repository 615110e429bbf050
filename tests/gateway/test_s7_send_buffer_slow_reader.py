"""Review R7b-4, end to end: with ``server.client_send_buffer_bytes`` bounding the accepted socket,
a client that reads NOTHING of a ~600 kB streamed answer is seen by
``limits.client_min_read_bytes_per_s`` and its stream is ended (499 ``client_read_too_slow``).
Before, the kernel's autotuned send buffer (up to tcp_wmem max, 4 MiB) took the whole answer and
the stream completed as 200 with every token "relayed" to a client that got none of it."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from gateway.app import build_public_app
from gateway.server import uvicorn_config
from tests.gateway.test_s7_slow_reader import FAST_REPLICA, MAX_TOKENS, SLOW, _request_id
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.listeners import serving
from tests.support.waiting import wait_for


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.mark.parametrize(("config_overrides", "replica_cfg"), [(SLOW, FAST_REPLICA)])
async def test_a_client_reading_nothing_is_ended_under_a_bounded_send_buffer(stack: Any, audit_log: ListLog) -> None:  # noqa: F811
    c = stack.components
    async with serving() as serve:
        host, port = await serve(uvicorn_config(build_public_app(c, manage_lifecycle=False), "127.0.0.1", 0,
                                                limits=c.config.limits, client_send_buffer_bytes=16384))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(sock, (host, port))
            body = json.dumps({"model": "sim-model", "prompt": "tell me everything", "max_tokens": MAX_TOKENS,
                               "stream": True}).encode()
            await loop.sock_sendall(sock, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                    b"Content-Type: application/json\r\n"
                                    + f"Authorization: {stack.auth()['Authorization']}\r\n".encode()
                                    + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
            head = b""
            async with asyncio.timeout(20):
                while b"\r\n\r\n" not in head:
                    part = await loop.sock_recv(sock, 1)
                    assert part, "closed before the answer's head"
                    head += part
            rid = _request_id(head)
            # the client now reads nothing at all
            events = await wait_for(lambda: [e for e in audit_log.events if getattr(e, "request_id", None) == rid],
                                    timeout_s=60, what="the stream's audit event")
        finally:
            sock.close()
    assert events[0].status_code == 499, (events[0].status_code, events[0].error_code)  # before: 200
    assert events[0].error_code in ("client_read_too_slow", "client_write_stall")
    # R8-3 (session 8): no longer "< MAX_TOKENS": the replica's output received but not relayed is
    # charged too (here usually the whole answer with its usage chunk: basis usage, MAX_TOKENS)
    charged = c.ledger.totals()["tenant-a"].charged["output"]
    assert events[0].ledger.output_relayed <= charged <= MAX_TOKENS
    assert events[0].ledger.basis != "usage" or charged == MAX_TOKENS
