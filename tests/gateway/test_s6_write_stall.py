"""Session 6, N-3: a streamed answer whose client stops reading is ended after
``limits.client_write_stall_s`` (before: it held its upstream connection, its tenant's slot and the
replica's load until the client closed).

Over real loopback sockets: a client with a tiny receive buffer asks for a long stream and stops
reading. The gateway ends the stream: the replica's request ends (the router's load view drops to
0), the tenant's reservation is settled on the output relayed so far (basis ``relayed``, fewer than
asked), its slot is free, and the client's connection is aborted. Waits are on conditions.
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import pytest

from sim.replica import ReplicaConfig
from tests.support.waiting import wait_for

TD = "demo.prefixgate.test"
MAX_TOKENS = 4096  # the premium tier's cap (rego/data/prefixgate/config/tiers.json)


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.fixture
def replica_cfg() -> ReplicaConfig:
    return ReplicaConfig(time_scale=100.0, decode_s_per_token=0.02, stream_chunk_tokens=1)


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    # upstream bounds far away: only the client-side stall bound may end the stream
    return {"limits": {"client_write_stall_s": 0.5},
            "upstream": {"first_byte_timeout_s": 120, "read_timeout_s": 120, "total_timeout_s": 240},
            "tenancy": {"tenants": [{"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"],
                                     "models": ["sim-model"], "pools": ["default"], "tier": "premium",
                                     "max_output_tokens": MAX_TOKENS}]}}


async def test_stream_to_a_client_that_stops_reading_is_ended(stack: Any) -> None:
    host, port = stack.url.removeprefix("http://").split(":")
    # small kernel buffers on both ends (accepted sockets inherit the listener's SO_SNDBUF), so the
    # answer (~570 kB) cannot all be absorbed by the kernels before the client stops reading
    stack.servers[0].servers[0].sockets[0].setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
    reader, writer = await asyncio.open_connection(sock=sock)
    body = json.dumps({"model": "sim-model", "prompt": "tell me everything", "max_tokens": MAX_TOKENS,
                       "stream": True}).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Authorization: {stack.auth()['Authorization']}\r\n".encode()
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert head.startswith(b"HTTP/1.1 200")
    loads, ledger = stack.components.router.loads, stack.components.ledger
    await wait_for(lambda: loads.snapshot("r0").running_requests == 1, what="the stream runs on the replica")
    # the client reads nothing more; the gateway must end the stream on its own
    await wait_for(lambda: loads.snapshot("r0").running_requests == 0
                   and ledger.totals()["tenant-a"].open_reservations == 0,
                   timeout_s=20, what="the stalled stream ended, its reservation settled")
    totals = ledger.totals()["tenant-a"]
    assert 0 < totals.charged["output"] < MAX_TOKENS  # charged what was relayed, not the whole reservation
    assert stack.components.limiter.in_flight("tenant-a") == 0
    try:  # the connection was aborted: reading what is left ends (EOF or reset)
        async with asyncio.timeout(10):
            while await reader.read(65536):
                pass
    except ConnectionError:
        pass
    writer.close()
