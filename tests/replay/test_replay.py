from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from sim.replay import ReplayConfig, replay
from sim.replica import STATE_KEY, ReplicaConfig, create_app, run_app_on
from sim.trace import DEFAULT_TRACE_PATH, TraceRequest, load_mooncake

SCALE = 50.0


@pytest.fixture
async def replica() -> AsyncIterator[tuple[str, web.Application]]:
    app = create_app(ReplicaConfig(replica_id="r0", time_scale=SCALE, decode_s_per_token=0.01))
    runner, url = await run_app_on(app, "127.0.0.1", 0)
    try:
        yield url, app
    finally:
        await runner.cleanup()


async def test_replay_collects_ttft_and_cached_tokens(replica: tuple[str, web.Application]) -> None:
    url, app = replica
    a = TraceRequest(0, 0.0, 1024, 4, (0, 1))
    b = TraceRequest(1, 5.0, 1536, 4, (0, 1, 2))  # shares A's 64 tokens; sent 0.1 s wall later
    c = TraceRequest(2, 5.0, 1024, 4, (0, 1))  # same prompt as A, other tenant -> other salt
    res = await replay(
        [a, b, c], ReplayConfig(base_url=url, time_scale=SCALE), ["tenant-a", "tenant-a", "tenant-b"],
        salt_for=lambda t: f"salt-{t}",
    )
    assert res.errors_by_kind() == {}
    ra, rb, rc = res.records
    assert (ra.prompt_tokens, ra.cached_tokens) == (64, 0)
    assert (rb.prompt_tokens, rb.cached_tokens) == (96, 64)
    assert (rc.prompt_tokens, rc.cached_tokens) == (64, 0)
    for r in res.records:
        assert r.ttft_s is not None and r.e2e_s is not None and 0 < r.ttft_s <= r.e2e_s
        assert r.completion_tokens == 4
    # trace-second TTFT covers at least the modelled prefill: 0.005 s + 1024 real tokens / 10k tok/s
    assert ra.ttft_s >= 0.1
    assert res.client_hit_rate() == pytest.approx(64 / 224)
    assert app[STATE_KEY].counters.cached_tokens == 64


async def test_replay_real_trace_slice(replica: tuple[str, web.Application]) -> None:
    url, app = replica
    reqs = load_mooncake(DEFAULT_TRACE_PATH, limit=40)
    res = await replay(reqs, ReplayConfig(base_url=url, time_scale=SCALE, max_tokens_cap=4))
    assert len(res.records) == 40 and not res.errors_by_kind()
    assert all(r.completion_tokens == min(4, max(1, q.output_length)) for r, q in zip(res.records, reqs))
    st = app[STATE_KEY].counters
    assert st.prompt_tokens == sum(r.prompt_tokens or 0 for r in res.records)
    assert st.cached_tokens == sum(r.cached_tokens or 0 for r in res.records) > 0


async def _stub_app() -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if request.headers.get("Authorization") != f"Bearer tok-{body.get('cache_salt')}":
            return web.json_response({"error": "unauthenticated"}, status=401)
        if body["cache_salt"] == "tenant-b":
            return web.json_response({"error": "rate limited"}, status=429)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"text":"x"}]}\n\n')
        if body["cache_salt"] == "tenant-c":  # stream without a usage chunk
            await resp.write(b"data: [DONE]\n\n")
            return resp
        await resp.write(b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,'
                         b'"prompt_tokens_details":{"cached_tokens":2}}}\n\ndata: [DONE]\n\n')
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    return app


async def test_replay_headers_and_error_kinds() -> None:
    runner, url = await run_app_on(await _stub_app(), "127.0.0.1", 0)
    try:
        reqs = [TraceRequest(i, 0.0, 100, 1, (0,)) for i in range(4)]
        tenants = ["tenant-a", "tenant-b", "tenant-c", "tenant-d"]
        res = await replay(
            reqs, ReplayConfig(base_url=url), tenants,
            headers_for=lambda t: {"Authorization": f"Bearer tok-{t}"} if t != "tenant-d" else {},
            salt_for=lambda t: t,
        )
    finally:
        await runner.cleanup()
    errs = [r.error for r in res.records]
    assert errs == [None, "http_429", "stream", "http_401"]
    assert res.records[0].cached_tokens == 2 and res.records[0].ttft_s is not None
    assert res.errors_by_kind() == {"http_429": 1, "stream": 1, "http_401": 1}


async def test_replay_connect_error_and_bad_scale() -> None:
    from sim.procs import free_port

    url = f"http://127.0.0.1:{free_port()}"
    res = await replay([TraceRequest(0, 0.0, 100, 1, (0,))], ReplayConfig(base_url=url))
    assert res.records[0].error == "connect"
    with pytest.raises(ValueError):
        await replay([], ReplayConfig(base_url=url, time_scale=0))
