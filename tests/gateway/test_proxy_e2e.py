"""End-to-end: authenticated requests through the gateway to simulated replicas."""

from __future__ import annotations

import json

import pytest

LONG = " ".join(f"w{i}" for i in range(400))


@pytest.fixture
def config_overrides():
    """The replicas' ``cached_tokens`` reach the client (the default drops them: review R12-1)."""
    return {"tenancy": {"usage_cached_tokens": "pass"}}


def completion(prompt: str = LONG, **kw):
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": 8}
    body.update(kw)
    return body


async def test_plain_completion_routes_and_reports_cached_tokens(stack):
    r1 = await stack.client.post("/v1/completions", json=completion(), headers=stack.auth())
    assert r1.status_code == 200, r1.text
    u1 = r1.json()["usage"]
    assert u1["prompt_tokens"] == 400
    assert u1["prompt_tokens_details"]["cached_tokens"] == 0
    r2 = await stack.client.post("/v1/completions", json=completion(), headers=stack.auth())
    assert r2.status_code == 200
    # same tenant, same prompt: routed to the replica holding the prefix
    assert r2.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= 384


async def test_streaming_passthrough_and_usage_hidden_unless_asked(stack):
    async with stack.client.stream("POST", "/v1/chat/completions", headers=stack.auth(), json={
        "model": "sim-model", "stream": True, "max_tokens": 10,
        "messages": [{"role": "user", "content": LONG}],
    }) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        text = (await r.aread()).decode()
    events = [e for e in text.split("\n\n") if e.strip()]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    assert chunks and all(c.get("choices") for c in chunks)  # usage-only chunk dropped
    async with stack.client.stream("POST", "/v1/chat/completions", headers=stack.auth(), json={
        "model": "sim-model", "stream": True, "max_tokens": 10, "stream_options": {"include_usage": True},
        "messages": [{"role": "user", "content": LONG}],
    }) as r:
        text = (await r.aread()).decode()
    chunks = [json.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: {")]
    usage = [c["usage"] for c in chunks if c.get("usage")]
    assert usage and usage[-1]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_client_cache_salt_is_overwritten(stack):
    # tenant-b sends a prompt tenant-a warmed, with a guessed or copied salt: no cross-tenant hit
    salt_a = stack.components.keys.cache_salt(stack.components.registry.get("tenant-a"))
    for i, salt in enumerate(("", "tenant-a", salt_a)):
        prompt = f"variant{i} {LONG}"
        ra = await stack.client.post("/v1/completions", json=completion(prompt), headers=stack.auth("tenant-a/app"))
        assert ra.status_code == 200
        rb = await stack.client.post("/v1/completions", json=completion(prompt, cache_salt=salt),
                                     headers=stack.auth("tenant-b/app"))
        assert rb.status_code == 200
        assert rb.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    # and A itself still hits its own cache for the last prompt
    ra = await stack.client.post("/v1/completions", json=completion(prompt), headers=stack.auth("tenant-a/app"))
    assert ra.json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


async def test_unauthenticated_refused(stack):
    r = await stack.client.post("/v1/completions", json=completion())
    assert r.status_code == 401
    assert r.headers["www-authenticate"].startswith("Bearer")
    assert r.json()["error"]["type"] == "authentication_error"


async def test_models_lists_only_tenant_models(stack):
    r = await stack.client.get("/v1/models", headers=stack.auth())
    assert r.status_code == 200
    assert [m["id"] for m in r.json()["data"]] == ["sim-model"]
    assert (await stack.client.get("/v1/models")).status_code == 401
