"""Fixtures for hostile-input tests: replicas that record what reaches them, and a raw HTTP/1.1 client.

``capture`` runs three simulated replicas (``sim.replica.create_app``) with
one extra aiohttp middleware that records every inference request that
reaches the replica (path, query, headers, parsed JSON body). The gateway
is pointed at them through ``config_overrides`` (r0, r1: pool ``default``;
r2: pool ``eu``, the regulated tenant's), so every test in this directory
can assert on the exact body the gateway forwarded. ``capture.reject``
makes a replica answer inference calls with a given 4xx (its ``/health``
stays 200) to show client-caused errors never count against a replica.

``raw`` opens plain asyncio TCP streams to the gateway for the cases an
HTTP client library refuses to produce (lying or duplicated
``Content-Length``, a trickled body, a body that is never finished).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from sim.replica import ReplicaConfig, create_app, run_app_on


@dataclass
class Captured:
    """One inference request as it reached a replica (``body``: parsed JSON, or None if not JSON)."""

    replica: str
    path: str
    query: str
    headers: dict[str, str]
    body: Any
    raw: bytes = b""


@dataclass
class CaptureReplicas:
    """Three recording simulated replicas: ``urls[i]`` is replica ``r{i}``."""

    urls: list[str] = field(default_factory=list)
    runners: list[web.AppRunner] = field(default_factory=list)
    seen: list[Captured] = field(default_factory=list)
    reject: dict[str, int] = field(default_factory=dict)

    def bodies(self) -> list[Any]:
        return [c.body for c in self.seen]

    def clear(self) -> None:
        self.seen.clear()


def _recording_middleware(cap: CaptureReplicas, rid: str) -> Any:
    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method == "POST" and request.path.startswith("/v1/"):
            raw = await request.read()  # cached by aiohttp: the simulator reads it again
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            cap.seen.append(Captured(rid, request.path, request.query_string,
                                     {k.lower(): v for k, v in request.headers.items()}, body, raw))
            status = cap.reject.get(rid)
            if status is not None:
                return web.json_response(
                    {"error": {"message": "replica rejected it", "type": "invalid_request_error",
                               "code": "bad", "param": None}}, status=status)
        return await handler(request)

    return record


@pytest.fixture
async def capture(replica_cfg: ReplicaConfig) -> AsyncIterator[CaptureReplicas]:
    cap = CaptureReplicas()
    try:
        for i in range(3):
            app = create_app(dataclasses.replace(replica_cfg, replica_id=f"cap-{i}"))
            app.middlewares.append(_recording_middleware(cap, f"r{i}"))
            runner, url = await run_app_on(app, "127.0.0.1", 0)
            cap.runners.append(runner)
            cap.urls.append(url)
        yield cap
    finally:
        for r in cap.runners:
            await r.cleanup()


@pytest.fixture
def n_replicas() -> int:
    return 1  # the stack's own cluster is unused: the gateway talks to ``capture``


def stable_master_secret(tmp_path: Path) -> str:
    """A master-secret file the loader always accepts (64 hex characters).

    (tests/conftest.py writes 32 random bytes; when the last one is ``\\n``
    the loader strips it, sees 31 and the stack fails to start, about 1 run in 256.)
    """
    path = tmp_path / "master-stable.key"
    path.write_text(secrets.token_hex(32))
    os.chmod(path, 0o600)
    return str(path)


@pytest.fixture
def config_overrides(capture: CaptureReplicas, tmp_path: Path) -> dict[str, Any]:
    return {
        "tenancy": {"master_secret_file": stable_master_secret(tmp_path)},
        "replicas": [
            {"id": "r0", "url": capture.urls[0], "pool": "default"},
            {"id": "r1", "url": capture.urls[1], "pool": "default"},
            {"id": "r2", "url": capture.urls[2], "pool": "eu", "labels": {"data_residency": "eu"}},
        ],
        "limits": {"body_read_timeout_s": 0.6, "max_body_bytes": 65536},
    }


@dataclass
class RawResponse:
    """A parsed HTTP/1.1 response: status, lower-cased headers (all values), body bytes."""

    status: int
    headers: dict[str, list[str]]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class RawConn:
    """One TCP connection to the gateway's public listener."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def response(self, timeout_s: float = 5.0) -> RawResponse:
        """Read one response (Content-Length framed or until EOF) within ``timeout_s``."""
        async with asyncio.timeout(timeout_s):
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ")[1])
            headers: dict[str, list[str]] = {}
            for line in lines[1:]:
                if line:
                    k, _, v = line.partition(":")
                    headers.setdefault(k.strip().lower(), []).append(v.strip())
            if "content-length" in headers:
                body = await self.reader.readexactly(int(headers["content-length"][0]))
            else:
                body = await self.reader.read()
        return RawResponse(status, headers, body)

    async def closed_by_peer(self, timeout_s: float = 3.0) -> bool:
        """True when the server closes the connection (EOF) within ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                while await self.reader.read(65536):
                    pass
            return True
        except (TimeoutError, ConnectionError):
            return False

    async def close(self) -> None:
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except ConnectionError:
            pass


class Raw:
    """Factory of raw connections to ``host:port`` plus a request-head builder."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.conns: list[RawConn] = []

    async def connect(self) -> RawConn:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        conn = RawConn(reader, writer)
        self.conns.append(conn)
        return conn

    def head(self, path: str, headers: list[tuple[str, str]]) -> bytes:
        lines = [f"POST {path} HTTP/1.1", f"Host: {self.host}:{self.port}"]
        lines += [f"{k}: {v}" for k, v in headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


@pytest.fixture
async def raw(stack: Any) -> AsyncIterator[Raw]:
    host, port = stack.url.removeprefix("http://").rsplit(":", 1)
    r = Raw(host, int(port))
    try:
        yield r
    finally:
        for c in r.conns:
            await c.close()
