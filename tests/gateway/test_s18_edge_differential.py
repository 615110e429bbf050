"""Session 18 (issue 14): the usual request's guard path (gateway/edge_usual.py) on and off answer the same,
on the wire and in the audit, and only the usual request takes it.

Two public listeners of one gateway (one replica): one with ``guard_usual_request`` on (the default), one
with it off (today's path for every read). The same raw requests go to each: usual ones (a plain answer,
chat, an SSE stream, refusals 401/403/400/429, a replica failing with 500), and each kind of unusual one
(a head split over reads, a body split over reads, a pipelined second request in the same read, a chunked
body, ``Expect: 100-continue``, HTTP/1.0, ``Connection: close``, a body longer or shorter than its
``Content-Length``, odd header spellings, a head over ``max_header_bytes``), two requests on one kept-alive
connection and a client that disconnects mid-stream. Status, header fields (``date`` and per-request ids
masked), body bytes (ids and timestamps masked), whether the connection was closed, and each request's audit
event must match. The usual path's calls are counted: taken for each usual request, never for an unusual one.
"""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import Any

import httptools
import pytest

from gateway.app import build_public_app
from gateway.edge_usual import UsualRequest
from gateway.server import uvicorn_config
from tests.conftest import TD
from gateway.auditing import AuditHub
from tests.support.audit_log import ListLog
from tests.support.listeners import serving
from tests.support.waiting import wait_for

TENANTS = [
    {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"], "pools": ["default"],
     "max_prompt_tokens": 4000, "max_output_tokens": 256},
    # a prompt bucket of one token: any prompt is refused 429 before it is forwarded
    {"id": "tenant-b", "spiffe_ids": [f"spiffe://{TD}/tenant-b/"], "models": ["sim-model"], "pools": ["default"],
     "max_output_tokens": 256, "prompt_tokens_per_s": 0.001, "prompt_tokens_burst": 1},
]
#: every read of a guarded httptools protocol (its length), and every read the usual path took
READS: list[int] = []
USUAL: list[int] = []
MASKS = [(re.compile(rb'"(id|created|system_fingerprint)": ?("[^"]*"|[0-9]+)'), rb'"\1": "*"'),
         (re.compile(rb"(cmpl|chatcmpl|req)-[0-9A-Za-z_-]+"), rb"\1-*")]
VOLATILE = {b"date", b"x-request-id", b"retry-after", b"traceparent", b"x-prefixgate-replica", b"x-prefixgate-instance"}


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.fixture
def audit_log() -> ListLog:
    return ListLog()


@pytest.fixture
def audit_hub(audit_log: ListLog) -> AuditHub:
    return AuditHub(audit_log)


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    # the replica's health probes fail with its injected 500 too: it is never marked down here
    return {"tenancy": {"tenants": TENANTS}, "health": {"unhealthy_after": 1_000_000}}


class Answer:
    """One parsed answer (httptools' response parser callbacks)."""

    def __init__(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.body = b""
        self.done = False


class Reader:
    """Parses consecutive answers on one connection (a 100 Continue interim answer is kept as an answer)."""

    def __init__(self) -> None:
        self.answers: list[Answer] = []
        self.parser = httptools.HttpResponseParser(self)

    def on_message_begin(self) -> None:
        self.answers.append(Answer())

    def on_header(self, name: bytes, value: bytes) -> None:
        self.answers[-1].headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.answers[-1].status = self.parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self.answers[-1].body += body

    def on_message_complete(self) -> None:
        self.answers[-1].done = True


def body(prompt: str | None = None, **kw: Any) -> bytes:
    doc = {"model": "sim-model", "prompt": prompt or f"say {uuid.uuid4().hex}", "max_tokens": 8, **kw}
    return json.dumps(doc).encode()


def request(token: str | None, data: bytes, *, path: str = "/v1/completions", version: str = "1.1",
            extra: str = "") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    return (f"POST {path} HTTP/{version}\r\nHost: gw\r\nContent-Type: application/json\r\n{auth}{extra}"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


async def exchange(port: int, chunks: list[bytes], answers: int, *, read_size: int = 65536,
                   stop_after_head: bool = False, after_first: list[bytes] | None = None) -> tuple[Reader, bool]:
    """Send ``chunks``, read until ``answers`` answers are complete (or the head of the first with
    ``stop_after_head``: then close), sending ``after_first`` once the first answer is complete; returns
    the parsed answers and whether the server closed the connection."""
    reader_, writer = await asyncio.open_connection("127.0.0.1", port)
    parsed = Reader()
    closed = False
    try:
        for i, chunk in enumerate(chunks):
            before = len(READS)
            writer.write(chunk)
            await writer.drain()
            if i < len(chunks) - 1:  # the next piece only once the server has read this one: split reads
                await wait_for(lambda before=before: len(READS) > before, timeout_s=10, what="the server's read")
        sent_more = False
        while True:
            done = [a for a in parsed.answers if a.done and a.status != 100]
            if stop_after_head and parsed.answers and parsed.answers[0].status:
                break
            if after_first and not sent_more and done:
                sent_more = True
                for chunk in after_first:
                    writer.write(chunk)
                await writer.drain()
            if len(done) >= answers:
                # anything more? the server closes a Connection: close exchange right after the answer
                try:
                    closed = await asyncio.wait_for(reader_.read(1), 2) == b""
                except asyncio.TimeoutError:
                    closed = False
                break
            data = await asyncio.wait_for(reader_.read(read_size), 20)
            if not data:
                closed = True
                break
            parsed.parser.feed_data(data)
    finally:
        writer.close()
    return parsed, closed


def masked(data: bytes) -> bytes:
    for pattern, repl in MASKS:
        data = pattern.sub(repl, data)
    return data


def view(parsed: Reader, closed: bool) -> list[Any]:
    out: list[Any] = [closed]
    for a in parsed.answers:
        headers = [(n, b"*" if n in VOLATILE else masked(v)) for n, v in a.headers]
        out.append((a.status, headers, masked(a.body), a.done))
    return out


def request_ids(parsed: Reader) -> list[str]:
    return [dict(a.headers).get(b"x-request-id", b"").decode() for a in parsed.answers if a.status != 100]


def audit_view(events: list[Any], rid: str) -> list[Any]:
    return [(e.kind, e.outcome, e.status_code, e.error_code, e.tenant, e.endpoint, e.model, e.prompt_tokens,
             e.output_tokens, e.sequences, e.ledger.basis) for e in events if e.request_id == rid]


class Pair:
    """The two listeners (usual path on / off) of one stack and the comparison of an exchange."""

    def __init__(self, stack: Any, log: ListLog, on: int, off: int) -> None:
        self.stack, self.log, self.on, self.off = stack, log, on, off

    async def same(self, make: Any, answers: int = 1, *, usual: int | None = 0, **kw: Any) -> list[Any]:
        """Run ``make()`` (a fresh list of raw chunks) against both listeners; assert the same wire view
        and audit, and that the usual path was taken ``usual`` times on the listener with it on (None: not
        checked) and never on the other; return the view."""
        views, audits = [], []
        for port in (self.on, self.off):
            taken = len(USUAL)
            parsed, closed = await exchange(port, make(), answers, **kw)
            if port == self.off:
                assert len(USUAL) == taken, "the usual path was taken with it off"
            elif usual is not None:
                assert len(USUAL) - taken == usual, (len(USUAL) - taken, usual)
            views.append(view(parsed, closed))
            rids = [r for r in request_ids(parsed) if r]
            for rid in rids:
                await wait_for(lambda rid=rid: audit_view(self.log.events, rid), timeout_s=20,
                               what=f"audit event of {rid}")
            audits.append([audit_view(self.log.events, rid) for rid in rids])
        assert views[0] == views[1]
        assert audits[0] == audits[1]
        return views[0]


@pytest.fixture
async def pair(stack: Any, audit_log: ListLog, monkeypatch: Any) -> Any:
    from gateway.http_guard import GuardedHttpToolsProtocol

    c = stack.components
    feed, read = UsualRequest.guard_feed_usual, GuardedHttpToolsProtocol.data_received

    def counted_feed(self: Any, data: bytes, cut: int) -> None:
        USUAL.append(len(data))
        feed(self, data, cut)

    def counted_read(self: Any, data: bytes) -> None:
        READS.append(len(data))
        read(self, data)

    monkeypatch.setattr(UsualRequest, "guard_feed_usual", counted_feed)
    monkeypatch.setattr(GuardedHttpToolsProtocol, "data_received", counted_read)
    async with serving() as serve:
        ports = []
        for on in (True, False):
            cfg = uvicorn_config(build_public_app(c, manage_lifecycle=False), "127.0.0.1", 0, limits=c.config.limits)
            cfg.http.guard_usual_request = on  # the listener's own class (gateway/http_guard.py guarded_protocol)
            _, port = await serve(cfg)
            ports.append(port)
        yield Pair(stack, audit_log, *ports)


async def test_usual_requests_are_answered_and_audited_the_same(pair: Pair) -> None:
    st = pair.stack
    token = st.token()
    plain = await pair.same(lambda: [request(token, body())], usual=1)
    assert plain[1][0] == 200 and b'"choices"' in plain[1][2]
    chat = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "hi there"}],
                       "max_tokens": 8}).encode()
    assert (await pair.same(lambda: [request(token, chat, path="/v1/chat/completions")], usual=1))[1][0] == 200
    stream = await pair.same(lambda: [request(token, body(stream=True))], usual=1)
    assert stream[1][0] == 200 and stream[1][2].endswith(b"data: [DONE]\n\n")
    assert (await pair.same(lambda: [request(None, body())], usual=1))[1][0] == 401
    assert (await pair.same(lambda: [request(st.token("stranger/app"), body())], usual=1))[1][0] == 403
    assert (await pair.same(lambda: [request(token, b"{not json")], usual=1))[1][0] == 400
    first = await st.client.post("/v1/completions", content=body(), headers=st.auth("tenant-b/app"))
    assert first.status_code in (200, 429)  # its one-token bucket is in debt now
    assert (await pair.same(lambda: [request(st.token("tenant-b/app"), body())], usual=1))[1][0] == 429
    assert (await pair.same(lambda: [request(token, body(), path="/v1/completions?x=1")], usual=1))[1][0] == 200
    assert (await pair.same(lambda: [request(token, body(), path="/v1/chat%2Fcompletions")], usual=1))[1][0] == 404
    # keep-alive: two usual requests one after the other on one connection
    kept = await pair.same(lambda: [request(token, body())], answers=2, after_first=[request(token, body())], usual=2)
    assert [a[0] for a in kept[1:]] == [200, 200] and kept[0] is False
    # a slow reader: the stream read 64 bytes at a time
    slow = await pair.same(lambda: [request(token, body(stream=True, max_tokens=64))], read_size=64, usual=1)
    assert slow[1][2].endswith(b"data: [DONE]\n\n")


async def test_unusual_requests_take_todays_path_and_are_answered_the_same(pair: Pair) -> None:
    token = pair.stack.token()
    whole = request(token, body())
    cut = whole.index(b"\r\n\r\n") + 4
    # a head split over reads; a body split over reads
    assert (await pair.same(lambda: [whole[:40], whole[40:]]))[1][0] == 200
    assert (await pair.same(lambda: [whole[:cut + 5], whole[cut + 5:]]))[1][0] == 200
    # pipelined: the second request in the same read as the first (neither is usual: bytes follow the body)
    piped = await pair.same(lambda: [request(token, body()) + request(token, body(stream=True))], answers=2, usual=None)
    assert [a[0] for a in piped[1:]] == [200, 200]
    # chunked body
    data = body()
    chunked = (f"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"
               f"Authorization: Bearer {token}\r\nTransfer-Encoding: chunked\r\n\r\n").encode()
    chunked += b"%x\r\n%s\r\n0\r\n\r\n" % (len(data), data)
    assert (await pair.same(lambda: [chunked]))[1][0] == 200
    # Expect: 100-continue, HTTP/1.0, Connection: close (answered, then closed)
    assert (await pair.same(lambda: [request(token, body(), extra="Expect: 100-continue\r\n")]))[-1][0] == 200
    old = await pair.same(lambda: [request(token, body(), version="1.0")])
    assert old[0] is True and old[1][0] == 200
    close = await pair.same(lambda: [request(token, body(), extra="Connection: close\r\n")])
    assert close[0] is True and (b"connection", b"close") in close[1][1]
    # odd spellings: the field's name with a space before its colon (the parser refuses it), a Content-Length
    # with leading zeros, an upper-case Content-Length, two Host fields, a body shorter than declared then
    # the rest in a second read, a body longer than declared (bytes after it), an oversized head
    odd = whole.replace(b"Content-Type:", b"Content-Type :")
    assert (await pair.same(lambda: [odd]))[1][0] == 400
    bare_lf = whole.replace(b"Content-Type: application/json\r\n", b"Content-Type: application/json\n")
    assert (await pair.same(lambda: [bare_lf]))[1][0] in (200, 400)
    folded = whole.replace(b"Content-Type: application/json\r\n", b"Content-Type: application/\r\n json\r\n")
    assert (await pair.same(lambda: [folded]))[1][0] in (200, 400)
    n = len(data)
    zeros = whole.replace(b"Content-Length: %d" % n, b"Content-Length: 000%d" % n)
    assert (await pair.same(lambda: [zeros], usual=1))[1][0] == 200  # still the usual request: same answer
    upper = whole.replace(b"Content-Length:", b"CONTENT-LENGTH:")
    assert (await pair.same(lambda: [upper], usual=1))[1][0] == 200  # field names are case-blind: usual
    two_hosts = whole.replace(b"Host: gw\r\n", b"Host: gw\r\nHost: other\r\n")
    assert (await pair.same(lambda: [two_hosts]))[1][0] == 400
    short = whole.replace(b"Content-Length: %d" % n, b"Content-Length: %d" % (n + 2))
    assert (await pair.same(lambda: [short, b"  "]))[1][0] == 200
    longer = whole + b"\r\n"
    assert (await pair.same(lambda: [longer]))[1][0] == 200
    big = request(token, body(), extra="X-Pad: %s\r\n" % ("p" * 20000))
    assert (await pair.same(lambda: [big]))[1][0] == 431


async def test_a_client_that_disconnects_mid_stream_is_audited_the_same(pair: Pair) -> None:
    token = pair.stack.token()
    codes = []
    for port in (pair.on, pair.off):
        parsed, _ = await exchange(port, [request(token, body(stream=True, max_tokens=256))], 1, stop_after_head=True)
        rid = request_ids(parsed)[0]
        events = await wait_for(lambda rid=rid: audit_view(pair.log.events, rid), timeout_s=30,
                                what="the disconnected stream's audit event")
        codes.append([e[:4] for e in events])
    assert codes[0] == codes[1]
