from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sim.replica import ReplicaConfig, parse_request, RequestError
from tenancy.tokenizer import WordTokenizer, render_chat

PROMPT = " ".join(f"word{i}" for i in range(100))  # 100 tokens -> 6 full blocks of 16


async def post(session: aiohttp.ClientSession, url: str, body: Any, path: str = "/v1/completions") -> tuple[int, Any, aiohttp.ClientResponse]:
    async with session.post(url + path, json=body) as r:
        return r.status, await r.json(content_type=None), r


async def stats(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url + "/sim/stats") as r:
        return await r.json()


async def metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    async with session.get(url + "/metrics") as r:
        text = await r.text()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def sse_events(raw: str) -> list[str]:
    assert raw.endswith("\n\n")
    events = raw.split("\n\n")[:-1]
    for e in events:
        assert e.startswith("data: "), e
    return [e[len("data: "):] for e in events]


async def test_non_stream_completion_and_prefix_hit(make_cluster, session) -> None:
    c = await make_cluster()
    url = c.urls[0]
    st, body, resp = await post(session, url, {"model": "sim-model", "prompt": PROMPT, "max_tokens": 7})
    assert st == 200
    assert body["object"] == "text_completion"
    assert len(body["choices"][0]["text"].split()) == 7
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert resp.headers["X-Instance-Id"] == c.states[0].instance_id
    s1 = await stats(session, url)
    st, body2, _ = await post(session, url, {"prompt": PROMPT, "max_tokens": 7})
    assert body2["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
    s2 = await stats(session, url)
    first = s1["prefill_busy_s"]
    second = s2["prefill_busy_s"] - first
    cfg = ReplicaConfig()
    assert first == pytest.approx(cfg.prefill_overhead_s + 100 * 16.0 / cfg.prefill_tokens_per_s)
    assert second == pytest.approx(cfg.prefill_overhead_s + 4 * 16.0 / cfg.prefill_tokens_per_s)
    assert s2["cached_tokens"] == 96 and s2["prompt_tokens"] == 200 and s2["requests"] == 2


async def test_chat_non_stream_uses_gateway_tokenization(make_cluster, session) -> None:
    c = await make_cluster()
    msgs = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": PROMPT}]
    st, body, _ = await post(session, c.urls[0], {"model": "m", "messages": msgs, "max_completion_tokens": 3},
                             "/v1/chat/completions")
    assert st == 200
    assert body["object"] == "chat.completion" and body["model"] == "m"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert len(body["choices"][0]["message"]["content"].split()) == 3
    assert body["usage"]["prompt_tokens"] == len(WordTokenizer().encode(render_chat(msgs)))


async def test_cache_salt_isolates_tenants(make_cluster, session) -> None:
    c = await make_cluster()
    url = c.urls[0]
    await post(session, url, {"prompt": PROMPT, "cache_salt": "tenant-a"})
    _, other, _ = await post(session, url, {"prompt": PROMPT, "cache_salt": "tenant-b"})
    _, same, _ = await post(session, url, {"prompt": PROMPT, "cache_salt": "tenant-a"})
    _, unsalted, _ = await post(session, url, {"prompt": PROMPT})
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert same["usage"]["prompt_tokens_details"]["cached_tokens"] == 96
    assert unsalted["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


@pytest.mark.parametrize("chat", [False, True])
async def test_stream_sse_format_and_usage_chunk(make_cluster, session, chat: bool) -> None:
    c = await make_cluster(stream_chunk_tokens=3)
    body: dict[str, Any] = {"max_tokens": 8, "stream": True, "stream_options": {"include_usage": True}}
    if chat:
        body["messages"] = [{"role": "user", "content": PROMPT}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = PROMPT
        path = "/v1/completions"
    async with session.post(c.urls[0] + path, json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = await r.text()
    events = sse_events(raw)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 8
    content = chunks[:-1]
    assert len(content) == 1 + math.ceil(7 / 3)  # first token alone, then chunks of 3
    assert all(ch["usage"] is None for ch in content)
    if chat:
        assert all(ch["object"] == "chat.completion.chunk" for ch in content)
        assert content[0]["choices"][0]["delta"]["role"] == "assistant"
        text = "".join(ch["choices"][0]["delta"]["content"] for ch in content)
    else:
        text = "".join(ch["choices"][0]["text"] for ch in content)
    assert len(text.split()) == 8
    assert [ch["choices"][0]["finish_reason"] for ch in content] == [None] * (len(content) - 1) + ["length"]
    assert len({ch["id"] for ch in chunks}) == 1


async def test_stream_without_usage_option_has_no_usage_chunk(make_cluster, session) -> None:
    c = await make_cluster()
    async with session.post(c.urls[0] + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 2, "stream": True}) as r:
        events = sse_events(await r.text())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 2 and all("usage" not in ch for ch in chunks)


async def test_prefill_queue_is_fifo_and_shows_as_ttft(make_cluster, session) -> None:
    # 800 tokens x 16 / 10000 tok/s = 1.28 trace s of prefill each; time_scale 10 -> 0.128 s wall.
    c = await make_cluster(time_scale=10.0)
    url = c.urls[0]
    p1 = " ".join(f"a{i}" for i in range(800))
    p2 = " ".join(f"b{i}" for i in range(800))
    r1, r2 = await asyncio.gather(post(session, url, {"prompt": p1, "max_tokens": 1}),
                                  post(session, url, {"prompt": p2, "max_tokens": 1}))
    assert r1[0] == r2[0] == 200
    s = await stats(session, url)
    one = 0.005 + 800 * 16 / 10000
    assert s["prefill_busy_s"] == pytest.approx(2 * one)
    assert s["queue_wait_s"] >= 0.9 * one  # the second request waited for the first prefill
    m = await metrics(session, url)
    assert m["vllm:time_to_first_token_seconds_sum"] >= 3 * one * 0.9  # one + (wait + one)
    assert m["vllm:time_to_first_token_seconds_count"] == 2


async def test_decode_does_not_block_prefill_queue(make_cluster, session) -> None:
    c = await make_cluster(time_scale=10.0)  # 200 output tokens x 0.02 s = 4 trace s = 0.4 s wall
    url = c.urls[0]
    done: list[str] = []

    async def run(name: str, body: dict[str, Any]) -> None:
        await post(session, url, body)
        done.append(name)

    long = asyncio.create_task(run("long", {"prompt": "x y z", "max_tokens": 200}))
    await asyncio.sleep(0.05)
    await run("short", {"prompt": "p q r", "max_tokens": 1})
    await long
    assert done == ["short", "long"]


async def test_waiting_and_running_gauges(make_cluster, session) -> None:
    # time scale 0.5 (session 30, flake30; it was 2.0, ~0.32 s): the gauges are read while the first prefill
    # runs, and a loop stalled that long (a full GC collection of the test process: up to ~1.4 s measured) saw
    # it end first
    c = await make_cluster(time_scale=0.5)
    url, state = c.urls[0], c.states[0]
    big = " ".join(f"w{i}" for i in range(400))  # 0.645 trace s -> ~1.3 s wall each
    tasks = [asyncio.create_task(post(session, url, {"prompt": big + f" {k}", "max_tokens": 1})) for k in range(3)]
    for _ in range(200):
        if state.waiting == 2:
            break
        await asyncio.sleep(0.005)
    m = await metrics(session, url)
    assert m["vllm:num_requests_waiting"] == 2
    assert m["vllm:num_requests_running"] == 1
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_client_disconnect_cancels_queued_request(make_cluster, session) -> None:
    # time scale 0.5 (it was 2.0): the victim's cancellation lands while the first prefill (~1.3 s) still runs
    c = await make_cluster(time_scale=0.5)
    url, state = c.urls[0], c.states[0]
    big = " ".join(f"w{i}" for i in range(400))
    first = asyncio.create_task(post(session, url, {"prompt": big, "max_tokens": 1}))
    for _ in range(200):
        if state.running == 1:
            break
        await asyncio.sleep(0.005)
    victim_prompt = " ".join(f"v{i}" for i in range(64))
    with pytest.raises(asyncio.TimeoutError):
        async with session.post(url + "/v1/completions", json={"prompt": victim_prompt, "stream": True},
                                timeout=aiohttp.ClientTimeout(total=0.05)) as r:
            await r.read()
    await first
    for _ in range(200):
        if state.counters.cancellations == 1 and state.waiting == 0:
            break
        await asyncio.sleep(0.005)
    s = await stats(session, url)
    assert s["cancellations"] == 1 and s["waiting"] == 0 and s["running"] == 0
    assert s["prefills"] == 1  # the cancelled request never prefilled: its blocks are not cached
    _, again, _ = await post(session, url, {"prompt": victim_prompt, "max_tokens": 1})
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_metrics_names_and_counts(make_cluster, session) -> None:
    c = await make_cluster()
    url = c.urls[0]
    for _ in range(2):
        await post(session, url, {"prompt": PROMPT, "max_tokens": 5})
    m = await metrics(session, url)
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:request_prefill_time_seconds_sum", "vllm:request_prefill_time_seconds_count"):
        assert name in m
    assert m["vllm:prefix_cache_queries_total"] == 200
    assert m["vllm:prefix_cache_hits_total"] == 96
    assert m["vllm:prompt_tokens_total"] == 200
    assert m["vllm:generation_tokens_total"] == 10
    assert m["vllm:request_success_total"] == 2
    assert m["vllm:request_prefill_time_seconds_count"] == 2
    assert m["vllm:kv_cache_usage_perc"] == pytest.approx(6 / 4000)


async def test_models_health_and_sglang_probes(make_cluster, session) -> None:
    c = await make_cluster(2)
    async with session.get(c.urls[1] + "/health") as r:
        h = await r.json()
    assert h["status"] == "ok" and h["replica_id"] == "replica-1" and h["instance_id"] == c.states[1].instance_id
    async with session.get(c.urls[0] + "/v1/models") as r:
        assert (await r.json())["data"][0]["id"] == "sim-model"
    for path in ("/get_model_info", "/model_info", "/get_server_info", "/server_info"):
        async with session.get(c.urls[0] + path) as r:
            doc = await r.json()
        assert doc["model_path"] == "" and doc["tokenizer_path"] == ""


async def test_reset_keeps_instance_and_restart_changes_it(make_cluster, session) -> None:
    c = await make_cluster()
    url = c.urls[0]
    await post(session, url, {"prompt": PROMPT})
    iid = c.states[0].instance_id
    async with session.post(url + "/sim/reset") as r:
        assert r.headers["X-Instance-Id"] == iid
    s = await stats(session, url)
    assert s["requests"] == 0 and s["prompt_tokens"] == 0 and s["cache"]["blocks"] == 0
    assert (await metrics(session, url))["vllm:prompt_tokens_total"] == 0
    _, b, _ = await post(session, url, {"prompt": PROMPT})
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # cache was cleared
    async with session.post(url + "/sim/restart") as r:
        new = (await r.json())["instance_id"]
        assert r.headers["X-Instance-Id"] == new
    assert new != iid
    async with session.get(url + "/health") as r:
        assert (await r.json())["instance_id"] == new
    _, b, _ = await post(session, url, {"prompt": PROMPT})
    assert b["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", [1, 2]),
    ("/v1/completions", {"model": "m"}),
    ("/v1/completions", {"prompt": 5}),
    ("/v1/completions", {"prompt": "   "}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "8"}),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}),
    ("/v1/completions", {"prompt": "hi", "cache_salt": 7}),
    ("/v1/completions", {"prompt": "hi", "model": 3}),
    ("/v1/chat/completions", {"messages": []}),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}),
])
async def test_malformed_bodies_get_openai_400(make_cluster, session, path: str, body: Any) -> None:
    c = await make_cluster()
    st, err, _ = await post(session, c.urls[0], body, path)
    assert st == 400
    assert set(err["error"]) >= {"message", "type", "code"}
    assert err["error"]["type"] == "invalid_request_error"
    assert (await stats(session, c.urls[0]))["errors"] == 1


async def test_non_json_body_400(make_cluster, session) -> None:
    c = await make_cluster()
    async with session.post(c.urls[0] + "/v1/completions", data=b"{not json",
                            headers={"Content-Type": "application/json"}) as r:
        assert r.status == 400
        assert "error" in await r.json()


def test_parse_request_defaults() -> None:
    req = parse_request("completions", {"prompt": ["a b", "c"]}, "sim-model")
    assert req.max_tokens == 16 and not req.stream and req.cache_salt is None and req.model == "sim-model"
    assert req.tokens == WordTokenizer().encode("a b\nc")
    with pytest.raises(RequestError):
        parse_request("completions", {"prompt": "x", "stream_options": {"include_usage": 1}}, "m")
