"""Session 12, review R11c-1: a content-coded answer is decoded one bounded piece at a time.

A replica (or a compressing proxy in front of it) that answers ``Content-Encoding: gzip`` can send a
few KiB that inflate to many MiB. Before, the gateway decoded a whole network read at once (up to the
decoder's own 256 MiB bound) before the plain answer's size met ``limits.max_answer_bytes``; now each
read of the upstream stream decodes at most :data:`gateway.proxy.DECODE_PIECE_BYTES`, so the cap stops
decoding within one piece and the answer is refused as an uncompressed one above the cap: 502
``answer_too_large``, audited, not counted against the replica. The probes' whole-body decoding
(:func:`gateway.proxy.decode_body`) stops at its ``max_bytes`` + 1.
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web

import gateway.proxy as proxy
from gateway.upstream import Upstream
from tests.support import audit_log as audit_fixtures
from tests.support.audit_log import ListLog
from tests.support import fake_replicas
from tests.support.fake_replicas import PLAIN_ANSWER, PlainFake, base_app, completion, replicas_of, serving
from tests.support.waiting import wait_for

CAP = 256 * 1024
INFLATED = 16 << 20  # decoded size of the coded answer; ~16 KiB on the wire


def _answer(n: int) -> bytes:
    return (b'{"id":"c","object":"text_completion","choices":[{"index":0,"text":"' + b"a" * n
            + b'","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}')


BOMB = gzip.compress(_answer(INFLATED), 9)


Fake = PlainFake
audit_hub, audit_log = audit_fixtures.audit_hub, audit_fixtures.audit_log  # fixtures: the stack on a ListLog
n_replicas = fake_replicas.n_replicas  # fixture: the stack's simulated cluster is not used (one replica)


def _app(fake: Fake) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("prompt") == "inflate":
            return web.Response(body=BOMB, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        return web.json_response(PLAIN_ANSWER)
    return base_app(fake, completions)


@pytest.fixture
async def fakes() -> AsyncIterator[list[Fake]]:
    async with serving([Fake()], _app) as out:
        yield out


@pytest.fixture
def config_overrides(fakes: list[Fake]) -> dict[str, Any]:
    return replicas_of(fakes, limits={"max_answer_bytes": CAP})


@pytest.fixture
def decoded(monkeypatch: pytest.MonkeyPatch) -> dict[int, int]:
    """Decoded bytes handed out per upstream answer (``UpstreamStream.read_chunk``'s output, summed)."""
    seen: dict[int, int] = {}
    alive: list[proxy.UpstreamStream] = []  # held: no id reused by a later answer
    read_chunk = proxy.UpstreamStream.read_chunk

    async def spy(self: proxy.UpstreamStream) -> bytes:
        out = await read_chunk(self)
        if id(self) not in seen:
            alive.append(self)
        seen[id(self)] = seen.get(id(self), 0) + len(out)
        return out
    monkeypatch.setattr(proxy.UpstreamStream, "read_chunk", spy)
    return seen


@pytest.fixture
def replica_failures(monkeypatch: pytest.MonkeyPatch) -> list[proxy.UpstreamFailure]:
    """Every failure the gateway reported against a replica (``Upstream.failed``)."""
    seen: list[proxy.UpstreamFailure] = []
    failed = Upstream.failed

    def spy(self: Upstream, attempt: Any, fail: proxy.UpstreamFailure) -> None:
        seen.append(fail)
        failed(self, attempt, fail)
    monkeypatch.setattr(Upstream, "failed", spy)
    return seen


async def test_a_gzip_answer_inflating_past_the_cap_is_answer_too_large_decoded_only_near_the_cap(
        stack: Any, decoded: dict[int, int], replica_failures: list[proxy.UpstreamFailure],
        audit_log: ListLog) -> None:  # noqa: F811
    assert len(BOMB) < CAP // 8  # a small answer on the wire
    for _ in range(6):  # more than health.breaker_failures: the replica is not blamed
        r = await stack.client.post("/v1/completions", json=completion("inflate"), headers=stack.auth())
        assert r.status_code == 502, r.text
        assert r.json()["error"]["code"] == "answer_too_large"
        rid = r.headers["X-Request-Id"]
    # before: the first read decoded all 16 MiB at once
    assert decoded and max(decoded.values()) <= CAP + proxy.DECODE_PIECE_BYTES, decoded
    assert replica_failures == []
    events = await wait_for(lambda: [e for e in audit_log.events if getattr(e, "request_id", None) == rid],
                            what="the refusal's audit event")
    assert events[0].status_code == 502 and events[0].error_code == "answer_too_large"
    for tenant in ("tenant-a", "tenant-b"):  # the replica's circuit and the tenant's pair stay closed
        ok = await stack.client.post("/v1/completions", json=completion("hello"), headers=stack.auth(f"{tenant}/app"))
        assert ok.status_code == 200, ok.text
        assert ok.json() == PLAIN_ANSWER


def test_decode_body_stops_at_its_bound_plus_one_byte() -> None:
    dec = proxy.BodyDecoder("gzip", 1000)
    with pytest.raises(proxy.ContentCodingError):
        dec.feed(BOMB)
    assert dec.total == 1001  # before: a whole 1 MiB piece decoded
    assert proxy.decode_body(gzip.compress(b"x" * 1000), "gzip", 1000) == b"x" * 1000


class _Raw:
    """An upstream answer's raw body, read in the given chunks."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def read_chunk(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_an_upstream_stream_hands_out_its_decoded_body_one_bounded_piece_at_a_time(coding: str) -> None:
    body = b"".join(b"data: %d\n\n" % i for i in range(400_000))  # ~4.5 MB, compresses well
    coded = gzip.compress(body) if coding == "gzip" else zlib.compress(body)
    up = proxy.UpstreamStream(_Raw([coded[:7], coded[7:5000], coded[5000:]]), b"", None,  # type: ignore[arg-type]
                              proxy.BodyDecoder(coding))
    pieces = []
    while piece := await up.read_chunk():
        pieces.append(piece)
    assert b"".join(pieces) == body
    assert max(map(len, pieces)) <= proxy.DECODE_PIECE_BYTES < len(body)
    dec = proxy.BodyDecoder(coding)  # the end of the body with input still held back: all of it, counted once
    first = dec.feed_some(coded)
    assert dec.backlog and len(first) == proxy.DECODE_PIECE_BYTES
    assert first + dec.finish() == body and dec.total == len(body)
