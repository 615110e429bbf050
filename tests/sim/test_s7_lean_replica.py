"""The lean bench replica (bench/lean_replica.py, session 7) answers the simulated replica's shapes.

Same ``usage.prompt_tokens`` as the simulated replica for the same body (so
a gateway settles the same ledger amounts in front of either), the OpenAI
SSE shape, health with an instance id, and keep-alive for several requests
on one connection.
"""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp

from bench.lean_replica import serve
from sim.replica import parse_request
from tests.support.waiting import wait_for


async def _start(tmp_path: Path) -> tuple[asyncio.Task[None], list[dict[str, str]]]:
    ready = tmp_path / "ready.json"
    task = asyncio.ensure_future(serve(2, ready_file=ready))
    await wait_for(lambda: ready.exists() or task.done())
    return task, json.loads(ready.read_text())


async def test_completions_usage_matches_the_simulated_replica_and_keep_alive(tmp_path: Path) -> None:
    task, doc = await _start(tmp_path)
    try:
        assert [d["replica_id"] for d in doc] == ["replica-0", "replica-1"]
        body = {"model": "sim-model", "prompt": "Hello, big world! " * 5, "max_tokens": 3}
        want = len(parse_request("completions", body, "sim-model").tokens)
        conn = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=conn) as s:
            for _ in range(3):  # one connection, three requests
                async with s.post(doc[0]["url"] + "/v1/completions", json=body) as r:
                    assert r.status == 200 and r.headers["X-Instance-Id"]
                    got = await r.json()
                assert got["usage"]["prompt_tokens"] == want
                assert got["usage"]["completion_tokens"] == 3
                assert got["choices"][0]["finish_reason"] == "length"
            async with s.get(doc[1]["url"] + "/health") as r:
                assert r.status == 200 and (await r.json())["replica_id"] == "replica-1"
            async with s.post(doc[0]["url"] + "/v1/completions", data=b"{not json") as r:
                assert r.status == 400 and "error" in await r.json()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_chat_stream_is_openai_sse_with_usage_and_done(tmp_path: Path) -> None:
    task, doc = await _start(tmp_path)
    try:
        body = {"model": "sim-model", "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 2,
                "stream": True, "stream_options": {"include_usage": True}}
        async with aiohttp.ClientSession() as s, s.post(doc[0]["url"] + "/v1/chat/completions", json=body) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            text = (await r.read()).decode()
        events = [e.removeprefix("data: ") for e in text.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 3
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert chunks[1]["choices"][0]["finish_reason"] == "length"
        assert chunks[2]["choices"] == [] and chunks[2]["usage"]["prompt_tokens"] == len(
            parse_request("chat", body, "sim-model").tokens)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
