"""Issue 10, finding 5: compressed replica answers are decoded, never a 502 or a replica fault.

Tiny aiohttp replicas on loopback speak just enough of the OpenAI protocol
(plain JSON and SSE with a usage chunk, ``/health``):

- ``always-gzip`` / ``always-deflate``: compress every answer (JSON, SSE,
  ``/health``) whatever the request asked for — a compressing proxy in front
  of a replica. SSE is compressed incrementally (one sync flush per event),
  so the gateway receives partial compressed chunks.
- ``honour``: compresses with gzip only when the request's
  ``Accept-Encoding`` allows it, and records the header it saw.

Expected: the client gets a valid 200 JSON body / complete SSE stream, the
replica stays healthy, its circuit breaker is never charged, and the
gateway asks replicas for ``identity`` even when the client asks for gzip.
"""

from __future__ import annotations

import gzip
import json
import os
import secrets
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from sim.replica import run_app_on

EVENTS = ["Hel", "lo", " wor", "ld"]


@dataclass
class TinyReplica:
    mode: str
    url: str = ""
    runner: web.AppRunner | None = None
    accept_encodings: list[str] = field(default_factory=list)
    calls: int = 0

    def encoding(self, request: web.Request) -> str | None:
        if self.mode == "always-gzip":
            return "gzip"
        if self.mode == "always-deflate":
            return "deflate"
        asked = request.headers.get("Accept-Encoding", "")
        return "gzip" if "gzip" in asked.lower() else None


def _compressor(enc: str | None) -> Any:
    if enc is None:
        return None
    return zlib.compressobj(wbits=31 if enc == "gzip" else 15)


def _compress_all(enc: str | None, data: bytes) -> bytes:
    if enc is None:
        return data
    return gzip.compress(data) if enc == "gzip" else zlib.compress(data)


def build_app(rep: TinyReplica) -> web.Application:
    async def health(request: web.Request) -> web.Response:
        enc = rep.encoding(request)
        body = _compress_all(enc, json.dumps({"status": "ok", "instance_id": f"tiny-{rep.mode}"}).encode())
        headers = {"Content-Encoding": enc} if enc else {}
        return web.Response(body=body, content_type="application/json", headers=headers)

    async def completions(request: web.Request) -> web.StreamResponse:
        rep.calls += 1
        rep.accept_encodings.append(request.headers.get("Accept-Encoding", "<none>"))
        body = await request.json()
        enc = rep.encoding(request)
        usage = {"prompt_tokens": 5, "completion_tokens": len(EVENTS), "total_tokens": 5 + len(EVENTS),
                 "prompt_tokens_details": {"cached_tokens": 0}}
        headers = {"Content-Encoding": enc} if enc else {}
        if not body.get("stream"):
            doc = {"id": "cmpl-tiny", "object": "text_completion", "created": 0, "model": body["model"],
                   "choices": [{"index": 0, "text": "".join(EVENTS), "finish_reason": "stop"}], "usage": usage}
            return web.Response(body=_compress_all(enc, json.dumps(doc).encode()),
                                content_type="application/json", headers=headers)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", **headers})
        await resp.prepare(request)
        comp = _compressor(enc)
        events = [{"id": "cmpl-tiny", "object": "text_completion", "model": body["model"],
                   "choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in EVENTS]
        events.append({"id": "cmpl-tiny", "object": "text_completion", "model": body["model"],
                       "choices": [], "usage": usage})
        frames = [b"data: " + json.dumps(e).encode() + b"\n\n" for e in events] + [b"data: [DONE]\n\n"]
        for frame in frames:
            await resp.write(comp.compress(frame) + comp.flush(zlib.Z_SYNC_FLUSH) if comp else frame)
        if comp:
            await resp.write(comp.flush())
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    return app


@pytest.fixture(params=["always-gzip", "always-deflate", "honour"])
async def tiny(request: Any) -> AsyncIterator[TinyReplica]:
    rep = TinyReplica(request.param)
    rep.runner, rep.url = await run_app_on(build_app(rep), "127.0.0.1", 0)
    try:
        yield rep
    finally:
        await rep.runner.cleanup()


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.fixture
def config_overrides(tiny: TinyReplica, tmp_path: Path) -> dict[str, Any]:
    secret = tmp_path / "master-i10c.key"
    secret.write_text(secrets.token_hex(32))
    os.chmod(secret, 0o600)
    return {
        "tenancy": {"master_secret_file": str(secret)},
        "replicas": [{"id": "r0", "url": tiny.url, "pool": "default"}],
    }


@pytest.fixture
def faults(stack: Any, monkeypatch: Any) -> list[str]:
    """Every replica fault the gateway records (circuit breaker charges)."""
    seen: list[str] = []
    rs = stack.components.replica_set
    original = rs.record_failure

    def counting(replica_id: str) -> None:
        seen.append(replica_id)
        original(replica_id)

    monkeypatch.setattr(rs, "record_failure", counting)
    return seen


PROMPT = {"model": "sim-model", "prompt": "compressed answers " + " ".join(f"w{i}" for i in range(20)),
          "max_tokens": 4}


async def _assert_replica_fine(stack: Any, faults: list[str]) -> None:
    await stack.components.health.check_once()  # one more probe of the (compressed) /health
    state = stack.components.replica_set.state("r0")
    assert state.healthy
    assert state.consecutive_failures == 0
    assert state.circuit.value == "closed"
    assert faults == []


@pytest.mark.parametrize("client_accept", [None, "gzip, deflate, br"])
async def test_plain_answer_decoded(stack, tiny, faults, client_accept):
    headers = stack.auth()
    if client_accept:
        headers["Accept-Encoding"] = client_accept
    for _ in range(3):
        r = await stack.client.post("/v1/completions", headers=headers, json=PROMPT)
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["choices"][0]["text"] == "Hello world"
        assert doc["usage"]["completion_tokens"] == 4
    await _assert_replica_fine(stack, faults)
    if tiny.mode == "honour":
        # the gateway never lets the client's Accept-Encoding through, and asks for identity
        assert tiny.accept_encodings and all(a == "identity" for a in tiny.accept_encodings), tiny.accept_encodings


@pytest.mark.parametrize("client_accept", [None, "gzip"])
async def test_streamed_answer_decoded(stack, tiny, faults, client_accept):
    headers = stack.auth()
    if client_accept:
        headers["Accept-Encoding"] = client_accept
    for _ in range(3):
        async with stack.client.stream("POST", "/v1/completions", headers=headers,
                                       json={**PROMPT, "stream": True}) as r:
            assert r.status_code == 200
            raw = b"".join([c async for c in r.aiter_raw()])
        events = [e for e in raw.decode().split("\n\n") if e.strip()]
        assert events[-1] == "data: [DONE]"
        texts = [json.loads(e.removeprefix("data: "))["choices"][0]["text"] for e in events[:-1]]
        assert "".join(texts) == "Hello world"  # the usage chunk (not asked for) is dropped
    await _assert_replica_fine(stack, faults)
    if tiny.mode == "honour":
        assert tiny.accept_encodings and all(a == "identity" for a in tiny.accept_encodings), tiny.accept_encodings
