"""Review R8-3: a client that stops reading a stream no longer chooses how little output its tenant pays.

End to end (real loopback sockets, small kernel buffers, one simulated replica that generates the whole
4096-token answer at once): the client reads the answer's head, then nothing; once the replica has
finished generating, it closes. Before the fix the tenant was charged the output *relayed* to the client
(a fraction; ledger basis ``relayed``); now it is charged what the engine generated (the replica's usage
chunk, already in the gateway's upstream buffer; basis ``usage``). Unit cases of
:func:`gateway.stream_charge.settle_client_end` cover the rest of the rule: output received but not
relayed counts, and a replica held back by the client (more than ``HIGH_WATER`` bytes waiting, no usage)
makes the count unknown (the reservation is charged).
"""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import pytest

from gateway.app import build_public_app
from gateway.proxy import UpstreamStream
from gateway.server import uvicorn_config
from gateway.sse import SseScanner
from gateway.stream_charge import settle_client_end
from gateway.upstream_conn import HIGH_WATER, UpstreamResponse
from sim.replica import ReplicaConfig
from tenancy.ledger import charge_for
from tests.gateway.test_s7_slow_reader import MAX_TOKENS, TENANTS, UPSTREAM, _request_id, ask_for_stream
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.listeners import serving
from tests.support.waiting import wait_for

#: the whole answer (4096 one-token events, ~0.8 MB) generated in ~0.1 s: far faster than the client reads
INSTANT_REPLICA = ReplicaConfig(time_scale=1000.0, decode_s_per_token=0.02, stream_chunk_tokens=1)
#: the client-side bounds far away: only the client's close ends the stream
CONFIG = {"limits": {"client_write_stall_s": 120, "client_min_read_bytes_per_s": 1, "client_min_read_window_s": 120},
          "upstream": UPSTREAM, "tenancy": TENANTS}


@pytest.fixture
def n_replicas() -> int:
    return 1


async def _replica_stats(url: str) -> dict[str, Any]:
    async with httpx.AsyncClient() as client:
        return (await client.get(f"{url}/sim/stats")).json()


@pytest.mark.parametrize("parser", ["httptools", "h11"])
@pytest.mark.parametrize(("config_overrides", "replica_cfg"), [(CONFIG, INSTANT_REPLICA)])
async def test_a_client_that_stops_reading_pays_the_generated_output(stack: Any, audit_log: ListLog,  # noqa: F811
                                                                     parser: str, monkeypatch: Any) -> None:
    url = stack.cluster.urls[0]
    received_whole: list[UpstreamResponse] = []  # the gateway holds the whole answer (usage included)
    finish = UpstreamResponse._finish

    def spy_finish(self: UpstreamResponse) -> None:
        finish(self)
        received_whole.append(self)

    monkeypatch.setattr(UpstreamResponse, "_finish", spy_finish)
    c = stack.components
    loop = asyncio.get_running_loop()
    async with serving() as serve:
        addr = await serve(uvicorn_config(build_public_app(c, manage_lifecycle=False), "127.0.0.1", 0, http=parser,
                                          limits=c.config.limits, client_send_buffer_bytes=16384))
        sock, head = await ask_for_stream(*addr, stack.auth()['Authorization'])
        assert head.startswith(b"HTTP/1.1 200"), head
        rid = _request_id(head)
        done = await _read_a_little_then_close_when_generated(loop, sock, url, received_whole)
        await _assert_charged_generated(stack, audit_log, rid, done)


async def _read_a_little_then_close_when_generated(loop: Any, sock: socket.socket, url: str,
                                                   received_whole: list[UpstreamResponse]) -> dict[str, Any]:
    done: dict[str, Any] = {}
    try:
        await loop.sock_recv(sock, 1024)  # a little of the answer, then nothing

        async def finished() -> bool:
            done.update(await _replica_stats(url))
            return int(done.get("completed", 0)) >= 1

        async with asyncio.timeout(30):
            while not await finished():  # the engine generated the whole answer
                await asyncio.sleep(0.02)
        # ... and the gateway received all of it (the replica's "completed" counter moves when its last
        # event is written, before the bytes cross loopback: on a loaded machine the client's close could
        # be processed first, CI stop 24; output sent after the gateway's last read is R8-3's residual)
        await wait_for(lambda: received_whole, timeout_s=30, what="the gateway received the whole answer")
    finally:
        sock.close()  # the client leaves with most of the answer unread
    return done


async def _assert_charged_generated(stack: Any, audit_log: ListLog, rid: str, done: dict[str, Any]) -> None:  # noqa: F811
    ledger = stack.components.ledger
    await wait_for(lambda: ledger.totals()["tenant-a"].open_reservations == 0, timeout_s=30,
                   what="the stream ended, its reservation settled")
    events = await wait_for(lambda: [e for e in audit_log.events if getattr(e, "request_id", None) == rid],
                            what="the stream's audit event")
    generated = int(done["generation_tokens"])
    assert generated == MAX_TOKENS
    assert events[0].status_code == 499
    charged = ledger.totals()["tenant-a"].charged["output"]
    assert charged == generated, (charged, generated, events[0])  # before R8-3: a fraction (basis relayed)
    assert events[0].ledger.basis == "usage" and events[0].ledger.output_charged == generated
    assert events[0].ledger.output_relayed < generated  # what the client took is still reported as such


def _event(text: str) -> bytes:
    return b"data: " + json.dumps({"id": "x", "object": "text_completion", "model": "m",
                                   "choices": [{"index": 0, "text": text, "finish_reason": None}]}).encode() + b"\n\n"


USAGE = b"data: " + json.dumps({"id": "x", "object": "text_completion", "model": "m", "choices": [],
                                "usage": {"prompt_tokens": 5, "completion_tokens": 4096}}).encode() + b"\n\n"


def _stream(chunks: list[bytes], complete: bool) -> UpstreamStream:
    resp = UpstreamResponse(None)  # type: ignore[arg-type]  # no connection: bytes fed by hand
    for c in chunks:
        resp._feed(c)
    if complete:
        resp._finish()
    return UpstreamStream(response=resp, first_chunk=b"", instance_id=None)


def test_buffered_usage_settles_on_the_replicas_count() -> None:
    scanner = SseScanner(keep_usage_chunk=False)
    scanner.feed(_event("a") * 3)
    assert settle_client_end(_stream([_event("b") * 10, USAGE, b"data: [DONE]\n\n"], True), scanner)
    assert scanner.usage == {"prompt_tokens": 5, "completion_tokens": 4096}


def test_output_received_but_not_relayed_counts() -> None:
    scanner = SseScanner(keep_usage_chunk=False)
    scanner.feed(_event("a") * 3)
    assert settle_client_end(_stream([_event("b") * 10], False), scanner)  # the replica still generating
    assert scanner.usage is None and scanner.output_tokens == 13
    assert charge_for(5, 100, usage=None, progress="streamed", relayed_output=13) == (5, 13, "relayed")


def test_a_replica_held_back_by_the_client_is_charged_the_reservation() -> None:
    scanner = SseScanner(keep_usage_chunk=False)
    big = _event("x" * 4000)
    held_back = _stream([big] * (HIGH_WATER // len(big) + 2), False)  # reading had paused: count unknown
    assert not settle_client_end(held_back, scanner)
    assert charge_for(5, 100, usage=None, progress="unknown", relayed_output=scanner.output_tokens) == (
        5, 100, "reservation")
    # the same bytes with the answer's end (usage) received: the replica's count
    scanner = SseScanner(keep_usage_chunk=False)
    assert settle_client_end(_stream([big] * (HIGH_WATER // len(big) + 2) + [USAGE], True), scanner)
    assert scanner.usage is not None


def test_nothing_buffered_and_after_done() -> None:
    scanner = SseScanner(keep_usage_chunk=False)
    assert settle_client_end(_stream([], False), scanner) and scanner.output_tokens == 0
    assert settle_client_end(None, scanner)
    scanner.feed(b"data: [DONE]\n\n")
    assert settle_client_end(_stream([b"garbage that is never read"], False), scanner)
