"""HTTP framing abuse over raw sockets: oversize declared bodies, lying Content-Length,
trickled bodies, duplicated headers. Limits from conftest: 64 KiB body cap, 0.6 s body read timeout."""

from __future__ import annotations

import asyncio
import json
import time
from tests.support.waiting import wait_for

from gateway.server import DEFAULT_HTTP_PARSER  # the stack's parser (both: tests/hostile/test_i10_http_framing.py)

LONG = " ".join(f"w{i}" for i in range(64))
BODY = json.dumps({"model": "sim-model", "prompt": LONG, "max_tokens": 4}).encode()


def _hdrs(stack, **extra: str) -> list[tuple[str, str]]:
    h = [("Authorization", stack.auth()["Authorization"]), ("Content-Type", "application/json")]
    h += [(k.replace("_", "-"), v) for k, v in extra.items()]
    return h


async def test_huge_content_length_refused_before_body_is_sent(stack, capture, raw):
    conn = await raw.connect()
    declared = 50 * 1024 * 1024
    await conn.send(raw.head("/v1/completions", _hdrs(stack, Content_Length=str(declared))))
    await conn.send(b'{"model": "sim-model", "prompt": "' + b"a " * 1000)  # a first chunk only
    # the 413 arrives although 50 MiB minus 2 KB were never sent
    resp = await conn.response(timeout_s=3.0)
    assert resp.status == 413
    assert resp.json() == {"error": {"message": "request body exceeds 65536 bytes",
                                     "type": "invalid_request_error", "code": "body_too_large", "param": None}}
    assert capture.seen == []
    # the rest of the body is not read: the server closes the connection instead of draining 50 MiB
    assert await conn.closed_by_peer(timeout_s=3.0)


async def test_content_length_over_cap_without_any_body(stack, capture, raw):
    conn = await raw.connect()
    await conn.send(raw.head("/v1/completions", _hdrs(stack, Content_Length=str(65537))))
    resp = await conn.response(timeout_s=3.0)
    assert resp.status == 413 and resp.json()["error"]["code"] == "body_too_large"


async def test_chunked_body_over_cap_refused_while_streaming(stack, capture, raw):
    conn = await raw.connect()
    await conn.send(raw.head("/v1/completions", _hdrs(stack, Transfer_Encoding="chunked")))
    chunk = b"a " * 4096

    async def stream() -> None:
        first = b'{"model": "sim-model", "prompt": "'
        await conn.send(f"{len(first):x}\r\n".encode() + first + b"\r\n")
        for _ in range(1000):  # 8 MB if nobody stopped it
            await conn.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await asyncio.sleep(0.001)

    sender = asyncio.ensure_future(stream())
    try:
        resp = await conn.response(timeout_s=5.0)
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
    assert resp.status == 413 and resp.json()["error"]["code"] == "body_too_large"
    assert resp.headers.get("connection") == ["close"]
    assert capture.seen == []


async def test_content_length_shorter_than_body(stack, capture, raw):
    conn = await raw.connect()
    await conn.send(raw.head("/v1/completions", _hdrs(stack, Content_Length=str(20))) + BODY)
    resp = await conn.response()
    # only the declared 20 bytes are the body: a JSON fragment (h11 answers the app's JSON 400;
    # httptools answers the unparsable remainder with its own 400 first and closes)
    assert resp.status == 400
    if DEFAULT_HTTP_PARSER == "h11":
        assert resp.json()["error"] == {"message": "request body is not valid JSON",
                                        "type": "invalid_request_error", "code": "invalid_json", "param": None}
    # the smuggled remainder is never taken as a second request that reaches a replica
    try:
        await conn.response(timeout_s=1.0)
    except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
        pass
    await asyncio.sleep(0.2)
    assert capture.seen == []


async def test_content_length_longer_than_body_times_out_408(stack, capture, raw):
    conn = await raw.connect()
    t0 = time.perf_counter()
    await conn.send(raw.head("/v1/completions", _hdrs(stack, Content_Length=str(len(BODY) + 100))) + BODY)
    resp = await conn.response(timeout_s=5.0)
    elapsed = time.perf_counter() - t0
    assert resp.status == 408
    assert resp.json()["error"] == {"message": "request body not received within 0.6 s",
                                    "type": "invalid_request_error", "code": "body_timeout", "param": None}
    assert elapsed < 4.0  # bounded by limits.body_read_timeout_s, not by the client
    assert capture.seen == []
    assert stack.components.limiter.in_flight("tenant-a") == 0


async def test_trickled_body_cut_off_408(stack, capture, raw):
    conn = await raw.connect()
    await conn.send(raw.head("/v1/completions", _hdrs(stack, Content_Length=str(len(BODY)))))

    async def trickle() -> None:
        for i in range(len(BODY)):
            await conn.send(BODY[i:i + 1])
            await asyncio.sleep(0.05)  # the whole body would take ~len/20 s

    sender = asyncio.ensure_future(trickle())
    try:
        t0 = time.perf_counter()
        resp = await conn.response(timeout_s=5.0)
        assert time.perf_counter() - t0 < 4.0
    finally:
        sender.cancel()
        await asyncio.gather(sender, return_exceptions=True)
    assert resp.status == 408 and resp.json()["error"]["code"] == "body_timeout"
    assert capture.seen == []
    assert stack.components.limiter.in_flight("tenant-a") == 0


async def test_conflicting_content_lengths_rejected(stack, capture, raw):
    conn = await raw.connect()
    hdrs = _hdrs(stack) + [("Content-Length", str(len(BODY))), ("Content-Length", "5")]
    await conn.send(raw.head("/v1/completions", hdrs) + BODY)
    resp = await conn.response()
    # refused by the HTTP parser (h11) before the app: a request-smuggling vector never reaches routing
    assert resp.status == 400
    assert capture.seen == []


async def test_identical_duplicate_content_lengths_are_one(stack, capture, raw):
    conn = await raw.connect()
    hdrs = _hdrs(stack) + [("Content-Length", str(len(BODY))), ("Content-Length", str(len(BODY)))]
    await conn.send(raw.head("/v1/completions", hdrs) + BODY)
    resp = await conn.response()
    if DEFAULT_HTTP_PARSER == "h11":  # h11 folds equal repeats into one header
        assert resp.status == 200, resp.body
        assert len(capture.seen) == 1
    else:  # httptools (llhttp) refuses any repeated Content-Length: fail closed
        assert resp.status == 400, resp.body
        assert capture.seen == []


async def test_content_length_and_chunked_together_rejected(stack, capture, raw):
    conn = await raw.connect()
    hdrs = _hdrs(stack) + [("Content-Length", "5"), ("Transfer-Encoding", "chunked")]
    chunked = f"{len(BODY):x}\r\n".encode() + BODY + b"\r\n0\r\n\r\n"
    await conn.send(raw.head("/v1/completions", hdrs) + chunked)
    resp = await conn.response()
    assert resp.status in (200, 400)
    if resp.status == 200:  # RFC 9112 6.3: Transfer-Encoding overrides Content-Length; the whole body was read
        assert [c.body["prompt"] for c in capture.seen] == [LONG]
    else:
        assert capture.seen == []


async def test_negative_and_garbage_content_length(stack, capture, raw):
    for value in ("-1", "12abc", "1e3"):
        conn = await raw.connect()
        await conn.send(raw.head("/v1/completions", _hdrs(stack, Content_Length=value)) + BODY)
        resp = await conn.response()
        assert resp.status == 400, (value, resp.body)
    assert capture.seen == []


async def test_two_authorization_headers_same_tenant_still_refused(stack, capture, raw):
    conn = await raw.connect()
    auth = stack.auth()["Authorization"]
    hdrs = [("Authorization", auth), ("Authorization", auth), ("Content-Type", "application/json"),
            ("Content-Length", str(len(BODY)))]
    await conn.send(raw.head("/v1/completions", hdrs) + BODY)
    resp = await conn.response()
    assert resp.status == 400
    assert resp.json()["error"]["code"] == "malformed_authorization_header"
    assert capture.seen == []


async def test_client_abandons_body_midway_releases_lease(stack, capture, raw):
    conn = await raw.connect()
    await conn.send(raw.head("/v1/completions", _hdrs(stack, Content_Length=str(len(BODY)))) + BODY[:30])
    limiter, overload = stack.components.limiter, stack.components.overload
    # admitted and reading the body (with flow control on, issue 17, the concurrency slot is taken
    # only when the request leaves the queue: the request in flight is the sign of admission)
    await wait_for(lambda: overload.in_flight == 1, what="the gateway admitted the request")
    await conn.close()
    await wait_for(lambda: overload.in_flight == 0 and limiter.in_flight("tenant-a") == 0,
                   what="the request ended and its lease was released")
    assert capture.seen == []
