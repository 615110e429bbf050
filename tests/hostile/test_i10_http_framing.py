"""Issue 10, HTTP protocol items, under BOTH HTTP parsers uvicorn offers (h11 and httptools).

- Finding 4: a trailing slash is never answered with a redirect built from the ``Host`` header.
- Finding 6: a client that uploads its whole (too large) body before reading reads the 413 JSON.
- Cases on one keep-alive socket: ``Content-Length`` + ``Transfer-Encoding: chunked``, two
  different ``Content-Length`` headers, a body 1 byte over the limit, each followed by a
  pipelined request: 400, 400, 413, the connection closed each time, nothing extra reaches a
  replica (``capture`` records every inference call) or an admin route (every admin route
  calls ``Admin.authorize_operator`` first; the fixture counts those calls).

Each test starts its own public and admin listeners (uvicorn, parser chosen by the ``gw``
fixture's parameter) over the ``stack`` fixture's components; the recording replicas come
from tests/hostile/conftest.py. Limits here: 64 KiB body cap, 5 s body read timeout.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.app import build_admin_app, build_public_app
from gateway.server import GatewayServer, uvicorn_config

MAX_BODY = 65536
LONG = " ".join(f"w{i}" for i in range(64))
BODY = json.dumps({"model": "sim-model", "prompt": LONG, "max_tokens": 4}).encode()
TD = "demo.prefixgate.test"
OPERATOR = f"spiffe://{TD}/ops/admin"
ADMIN_AUD = "prefixgate-admin"
PARSERS = ["h11", "httptools"]


def _master_secret(tmp_path: Path) -> str:
    import os
    import secrets

    path = tmp_path / "master-i10.key"
    path.write_text(secrets.token_hex(32))
    os.chmod(path, 0o600)
    return str(path)


@pytest.fixture
def config_overrides(capture: Any, tmp_path: Path) -> dict[str, Any]:
    return {
        "tenancy": {"master_secret_file": _master_secret(tmp_path)},
        "replicas": [
            {"id": "r0", "url": capture.urls[0], "pool": "default"},
            {"id": "r1", "url": capture.urls[1], "pool": "default"},
            {"id": "r2", "url": capture.urls[2], "pool": "eu", "labels": {"data_residency": "eu"}},
        ],
        "limits": {"body_read_timeout_s": 5.0, "max_body_bytes": MAX_BODY},
    }


@dataclass
class Listeners:
    """The public and admin listeners of one test, on the parser ``parser``."""

    parser: str
    public: tuple[str, int]
    admin: tuple[str, int]
    admin_calls: list[str] = field(default_factory=list)

    def url(self, which: str = "public") -> str:
        host, port = getattr(self, which)
        return f"http://{host}:{port}"


@pytest.fixture(params=PARSERS)
async def gw(request: Any, stack: Any, monkeypatch: Any) -> AsyncIterator[Listeners]:
    c = stack.components
    calls: list[str] = []
    original = c.admin.authorize_operator

    async def counting(req: Any) -> Any:
        calls.append(req.url.path)
        return await original(req)

    monkeypatch.setattr(c.admin, "authorize_operator", counting)
    parser = request.param
    servers = [
        GatewayServer(uvicorn_config(build_public_app(c, manage_lifecycle=False), "127.0.0.1", 0, http=parser)),
        GatewayServer(uvicorn_config(build_admin_app(c), "127.0.0.1", 0, http=parser)),
    ]
    tasks = [asyncio.ensure_future(s.serve()) for s in servers]
    try:
        async with asyncio.timeout(10):
            while not all(s.started for s in servers):
                if any(t.done() for t in tasks):
                    raise RuntimeError("listener failed to start")
                await asyncio.sleep(0.01)
        addrs = [s.servers[0].sockets[0].getsockname()[:2] for s in servers]
        yield Listeners(parser, tuple(addrs[0]), tuple(addrs[1]), calls)
    finally:
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)


# ---------------------------------------------------------------- raw socket helpers


@dataclass
class Resp:
    status: int
    headers: dict[str, list[str]]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def _parse_responses(data: bytes) -> list[Resp]:
    """Every complete HTTP/1.1 response in ``data`` (Content-Length or chunked framed)."""
    out: list[Resp] = []
    while data:
        head, sep, rest = data.partition(b"\r\n\r\n")
        if not sep:
            break
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers: dict[str, list[str]] = {}
        for line in lines[1:]:
            k, _, v = line.partition(":")
            headers.setdefault(k.strip().lower(), []).append(v.strip())
        if "content-length" in headers:
            n = int(headers["content-length"][0])
            body, data = rest[:n], rest[n:]
        elif headers.get("transfer-encoding") == ["chunked"]:
            body = b""
            while True:
                size_line, _, rest = rest.partition(b"\r\n")
                size = int(size_line, 16)
                body += rest[:size]
                rest = rest[size + 2:]
                if size == 0:
                    break
            data = rest
        else:
            body, data = rest, b""
        out.append(Resp(status, headers, body))
    return out


async def exchange(addr: tuple[str, int], payload: bytes, timeout_s: float = 10.0) -> tuple[list[Resp], bool]:
    """Send ``payload`` on one connection; read until the server closes it.

    Returns ``(responses, closed)``: ``closed`` is False when the server kept
    the connection open for ``timeout_s`` seconds after the last byte.
    """
    reader, writer = await asyncio.open_connection(*addr)
    data = b""
    closed = False
    try:
        writer.write(payload)
        await writer.drain()
        try:
            async with asyncio.timeout(timeout_s):
                while True:
                    chunk = await reader.read(65536)
                    if not chunk:
                        closed = True
                        break
                    data += chunk
        except TimeoutError:
            closed = False
        except ConnectionError:
            closed = True
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass
    return _parse_responses(data), closed


def head(method: str, path: str, headers: list[tuple[str, str]], host: str = "gateway.test") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"] + [f"{k}: {v}" for k, v in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def chunked(body: bytes, piece: int = 4096) -> bytes:
    out = b""
    for i in range(0, len(body), piece):
        part = body[i:i + piece]
        out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    return out + b"0\r\n\r\n"


def tenant_headers(stack: Any) -> list[tuple[str, str]]:
    return [("Authorization", stack.auth()["Authorization"]), ("Content-Type", "application/json")]


def operator_headers(stack: Any) -> list[tuple[str, str]]:
    return [("Authorization", f"Bearer {stack.issuer.mint(OPERATOR, ADMIN_AUD)}")]


def follow_up(stack: Any, listener: str) -> bytes:
    """A complete, valid second request that would do something if it were ever processed."""
    if listener == "public":
        return head("POST", "/v1/completions", tenant_headers(stack) + [("Content-Length", str(len(BODY)))]) + BODY
    return head("GET", "/admin/replicas", operator_headers(stack))


def first_request(stack: Any, listener: str, headers: list[tuple[str, str]]) -> bytes:
    if listener == "public":
        return head("POST", "/v1/completions", tenant_headers(stack) + headers)
    return head("POST", "/admin/tenants/reload", operator_headers(stack) + headers)


# ---------------------------------------------------------------- cases: one keep-alive socket


@pytest.mark.parametrize("listener", ["public", "admin"])
async def test_content_length_with_chunked_then_pipelined_request(stack, capture, gw, listener):
    body = chunked(BODY)
    payload = first_request(stack, listener, [("Content-Length", "5"), ("Transfer-Encoding", "chunked")]) + body
    payload += follow_up(stack, listener)
    responses, closed = await exchange(getattr(gw, listener), payload)
    assert [r.status for r in responses] == [400], (gw.parser, responses)
    assert closed
    assert capture.seen == []
    assert gw.admin_calls == []


@pytest.mark.parametrize("listener", ["public", "admin"])
async def test_two_different_content_lengths_then_pipelined_request(stack, capture, gw, listener):
    headers = [("Content-Length", str(len(BODY))), ("Content-Length", "5")]
    payload = first_request(stack, listener, headers) + BODY + follow_up(stack, listener)
    responses, closed = await exchange(getattr(gw, listener), payload)
    assert [r.status for r in responses] == [400], (gw.parser, responses)
    assert closed
    assert capture.seen == []
    assert gw.admin_calls == []


async def test_identical_repeated_content_lengths_keep_framing_in_step(stack, capture, gw):
    # equal repeats are unambiguous (RFC 9110 8.6): h11 folds them into one header and serves
    # both pipelined requests; httptools refuses the first with its own 400 and closes.
    # Either way the two parsers never disagree about where a request ends.
    headers = [("Content-Length", str(len(BODY))), ("Content-Length", str(len(BODY)))]
    last = head("POST", "/v1/completions", tenant_headers(stack) + [("Content-Length", str(len(BODY))),
                                                                      ("Connection", "close")]) + BODY
    payload = first_request(stack, "public", headers) + BODY + last
    responses, closed = await exchange(gw.public, payload)
    assert closed
    if gw.parser == "h11":
        assert [r.status for r in responses] == [200, 200]
        assert len(capture.seen) == 2
    else:
        assert [r.status for r in responses] == [400]
        assert capture.seen == []


async def test_content_length_shorter_than_body_smuggles_nothing(stack, capture, gw):
    # the declared 20 bytes are the body (a JSON fragment: 400); the rest, a complete request
    # in disguise, must never reach a replica. (h11 answers the app's JSON 400 first;
    # httptools answers the unparsable remainder with its own 400 and closes.)
    smuggled = follow_up(stack, "public")
    payload = head("POST", "/v1/completions", tenant_headers(stack) + [("Content-Length", "20")]) + BODY[:20]
    payload += BODY[20:] + smuggled
    responses, closed = await exchange(gw.public, payload)
    assert responses and responses[0].status == 400, (gw.parser, responses)
    assert all(r.status == 400 for r in responses)
    assert closed
    assert capture.seen == []


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_body_one_byte_over_limit_then_pipelined_admin_request(stack, capture, gw, framing):
    prefix, suffix = b'{"model": "sim-model", "prompt": "', b'"}'
    over = prefix + b"a" * (MAX_BODY + 1 - len(prefix) - len(suffix)) + suffix
    assert len(over) == MAX_BODY + 1
    if framing == "content-length":
        first = head("POST", "/v1/completions", tenant_headers(stack) + [("Content-Length", str(len(over)))]) + over
    else:
        first = head("POST", "/v1/completions", tenant_headers(stack) + [("Transfer-Encoding", "chunked")])
        first += chunked(over)
    second = head("GET", "/admin/replicas", operator_headers(stack))
    third = follow_up(stack, "public")
    responses, closed = await exchange(gw.public, first + second + third)
    assert [r.status for r in responses] == [413], (gw.parser, responses)
    assert responses[0].json()["error"]["code"] == "body_too_large"
    assert responses[0].headers.get("connection") == ["close"]
    assert closed
    assert capture.seen == []
    assert gw.admin_calls == []


async def test_valid_pipelined_requests_still_served(stack, capture, gw):
    """Control: the guards do not break legitimate keep-alive pipelining."""
    payload = follow_up(stack, "public") + follow_up(stack, "public")
    reader, writer = await asyncio.open_connection(*gw.public)
    try:
        writer.write(payload)
        await writer.drain()
        data = b""
        async with asyncio.timeout(10):
            while len(_parse_responses(data)) < 2:
                chunk = await reader.read(65536)
                assert chunk, "connection closed early"
                data += chunk
    finally:
        writer.close()
    assert [r.status for r in _parse_responses(data)] == [200, 200]
    assert len(capture.seen) == 2


# ---------------------------------------------------------------- finding 4: no redirect from Host


@pytest.mark.parametrize("listener,method,path", [
    ("public", "POST", "/v1/completions/"),
    ("public", "POST", "/v1/chat/completions/"),
    ("public", "GET", "/v1/models/"),
    ("public", "GET", "/healthz/"),
    ("admin", "GET", "/admin/replicas/"),
    ("admin", "GET", "/admin/routing/"),
])
async def test_trailing_slash_is_not_redirected_to_client_host(stack, capture, gw, listener, method, path):
    hdrs = (tenant_headers(stack) if listener == "public" else operator_headers(stack))
    if method == "POST":
        hdrs = hdrs + [("Content-Length", str(len(BODY)))]
    payload = head(method, path, hdrs + [("Connection", "close")], host="evil.example:666")
    payload += BODY if method == "POST" else b""
    responses, _ = await exchange(getattr(gw, listener), payload)
    assert len(responses) == 1
    r = responses[0]
    assert not 300 <= r.status < 400, (gw.parser, r)
    assert r.status == 404
    assert "location" not in r.headers
    assert b"evil.example" not in r.body
    assert r.json()["error"]["code"] == "not_found"
    assert capture.seen == []


# ---------------------------------------------------------------- finding 6: a readable 413


FIVE_MB = 5 * 1024 * 1024


def _big_json() -> bytes:
    prefix, suffix = b'{"model": "sim-model", "prompt": "', b'"}'
    return prefix + b"a" * (FIVE_MB - len(prefix) - len(suffix)) + suffix


async def _gen(data: bytes, piece: int = 65536) -> AsyncIterator[bytes]:
    for i in range(0, len(data), piece):
        yield data[i:i + piece]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_oversized_upload_reads_413_json_with_httpx(stack, capture, gw, framing):
    data = _big_json()
    content: Any = data if framing == "content-length" else _gen(data)
    async with httpx.AsyncClient(base_url=gw.url(), timeout=30) as client:
        r = await client.post("/v1/completions", content=content,
                              headers={"Authorization": stack.auth()["Authorization"],
                                       "Content-Type": "application/json"})
    assert r.status_code == 413
    assert r.json() == {"error": {"message": f"request body exceeds {MAX_BODY} bytes",
                                  "type": "invalid_request_error", "code": "body_too_large", "param": None}}
    assert r.headers.get("connection") == "close"
    assert capture.seen == []
    assert stack.components.limiter.in_flight("tenant-a") == 0


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_refused_upload_before_body_read_is_readable(stack, capture, gw, framing):
    """The same for a refusal that comes before the body is read at all (no credential: 401)."""
    data = _big_json()
    content: Any = data if framing == "content-length" else _gen(data)
    async with httpx.AsyncClient(base_url=gw.url(), timeout=30) as client:
        r = await client.post("/v1/completions", content=content, headers={"Content-Type": "application/json"})
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error" or r.json()["error"]["code"]
    assert capture.seen == []

