"""Session 7, R6b-3: a client that reads a streamed answer slowly — a little before each per-write
deadline (``limits.client_write_stall_s``) — no longer holds its stream, its tenant's slot and the
replica's load for the whole answer: ``limits.client_min_read_bytes_per_s`` ends it, and
``limits.max_stream_s`` caps a stream's wall-clock time (Envoy's ``max_stream_duration``).

Over real loopback sockets with small kernel buffers. The slow reader is paced (it reads 1 KiB,
then yields 20 ms: that pacing is the behaviour under test, not a wait); every other wait is on a
condition. Before the fix the first test's client reads the whole answer up to ``[DONE]``.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from sim.replica import ReplicaConfig
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.waiting import wait_for

TD = "demo.prefixgate.test"
MAX_TOKENS = 4096  # the premium tier's cap (rego/data/prefixgate/config/tiers.json)
TENANTS = {"tenants": [{"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"],
                        "pools": ["default"], "tier": "premium", "max_output_tokens": MAX_TOKENS}]}
UPSTREAM = {"first_byte_timeout_s": 120, "read_timeout_s": 120, "total_timeout_s": 240}
# the per-write bound far away: only the rate bound may end the slow reader's stream
SLOW = {"limits": {"client_write_stall_s": 120, "client_min_read_bytes_per_s": 1_000_000,
                   "client_min_read_window_s": 3},
        "upstream": UPSTREAM, "tenancy": TENANTS}
LONG = {"limits": {"max_stream_s": 0.2}, "upstream": UPSTREAM, "tenancy": TENANTS}


@pytest.fixture
def n_replicas() -> int:
    return 1


#: 4096 tokens × >= 4 ms: a stream of >= 16 s producing ~35 kB/s (more than the slow reader takes)
SLOW_REPLICA = ReplicaConfig(time_scale=100.0, decode_s_per_token=0.4, stream_chunk_tokens=1)
#: 4096 tokens × >= 0.2 ms
FAST_REPLICA = ReplicaConfig(time_scale=100.0, decode_s_per_token=0.02, stream_chunk_tokens=1)


async def ask_for_stream(host: str, port: int, authorization: str) -> tuple[socket.socket, bytes]:
    """A raw non-blocking client socket (4 KiB receive buffer) connected to ``host:port`` that asked
    for a ``MAX_TOKENS`` stream; returns it and the answer head it read (byte by byte, 20 s at most)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    try:
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, (host, port))
        body = json.dumps({"model": "sim-model", "prompt": "tell me everything", "max_tokens": MAX_TOKENS,
                           "stream": True}).encode()
        await loop.sock_sendall(sock, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                + f"Authorization: {authorization}\r\n".encode()
                                + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        head = b""
        async with asyncio.timeout(20):
            while b"\r\n\r\n" not in head:
                part = await loop.sock_recv(sock, 1)
                assert part, "closed before the answer's head"
                head += part
    except BaseException:
        sock.close()  # the caller gets no socket to close
        raise
    return sock, head


async def _open_stream(stack: Any) -> tuple[socket.socket, bytes]:
    """:func:`ask_for_stream` at the stack's listener, whose send buffer is 4 KiB too; the answer is 200."""
    host, port = stack.url.removeprefix("http://").split(":")
    stack.servers[0].servers[0].sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock, head = await ask_for_stream(host, int(port), stack.auth()["Authorization"])
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock, head


def _request_id(head: bytes) -> str:
    for line in head.decode("latin-1").split("\r\n"):
        if line.lower().startswith("x-request-id:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError("no X-Request-Id")


async def _read_to_end(sock: socket.socket, pace_s: float | None, size: int = 65536) -> bytes:
    """Read until EOF or reset (60 s at most), ``size`` bytes at a time, yielding ``pace_s`` after each."""
    loop, got = asyncio.get_running_loop(), bytearray()
    try:
        async with asyncio.timeout(60):
            while part := await loop.sock_recv(sock, size):
                got += part
                if pace_s is not None:
                    await asyncio.sleep(pace_s)  # the slow reader's pace (the behaviour under test)
    except ConnectionError:
        pass
    finally:
        sock.close()
    return bytes(got)


async def _ended(stack: Any, audit_log: ListLog, rid: str) -> Any:  # noqa: F811 - fixture
    loads, ledger = stack.components.router.loads, stack.components.ledger
    await wait_for(lambda: loads.snapshot("r0").running_requests == 0
                   and ledger.totals()["tenant-a"].open_reservations == 0,
                   timeout_s=30, what="the stream ended, its reservation settled")
    assert stack.components.limiter.in_flight("tenant-a") == 0
    assert 0 < ledger.totals()["tenant-a"].charged["output"] < MAX_TOKENS  # what was relayed
    events = await wait_for(lambda: [e for e in audit_log.events if getattr(e, "request_id", None) == rid],
                            what="the stream's audit event")
    assert len(events) == 1 and events[0].status_code == 499
    return events[0]


@pytest.mark.parametrize(("config_overrides", "replica_cfg"), [(SLOW, SLOW_REPLICA)])
async def test_a_client_reading_below_the_minimum_rate_is_ended(stack: Any, audit_log: ListLog) -> None:  # noqa: F811
    sock, head = await _open_stream(stack)
    # <= ~25 kB/s, well below the replica's output: the server's buffer fills and sends wait
    got = await _read_to_end(sock, pace_s=0.02, size=512)
    assert b"data: [DONE]" not in got  # cut before the end (before the fix: the whole answer, ~600 kB)
    event = await _ended(stack, audit_log, _request_id(head))
    assert event.error_code == "client_read_too_slow"


@pytest.mark.parametrize(("config_overrides", "replica_cfg"), [(LONG, SLOW_REPLICA)])
async def test_a_stream_longer_than_max_stream_s_is_ended(stack: Any, audit_log: ListLog) -> None:  # noqa: F811
    sock, head = await _open_stream(stack)
    got = await _read_to_end(sock, pace_s=None)  # reads as fast as it can
    assert b"data: [DONE]" not in got
    event = await _ended(stack, audit_log, _request_id(head))
    assert event.error_code == "stream_duration_exceeded"


@pytest.mark.parametrize(("config_overrides", "replica_cfg"), [({"upstream": UPSTREAM, "tenancy": TENANTS},
                                                                 FAST_REPLICA)])
async def test_a_client_reading_at_full_speed_gets_the_whole_answer(stack: Any, audit_log: ListLog) -> None:  # noqa: F811
    sock, head = await _open_stream(stack)
    got = await _read_to_end(sock, pace_s=None)
    assert b"data: [DONE]" in got  # the default rate bound leaves a reader at full speed alone
    events = await wait_for(lambda: [e for e in audit_log.events if getattr(e, "request_id", None) == _request_id(head)],
                            what="the stream's audit event")
    assert events[0].status_code == 200 and events[0].error_code is None
