"""Review R12-1: a tenant's answers do not carry the replica's exact ``cached_tokens`` (a cross-tenant
prime+probe channel on the shared KV capacity) unless its ``usage_cached_tokens`` is ``pass``; the
gateway's own audit keeps the true value (``delivered_prefix_tokens``)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from gateway.config_tenancy import TenancyConfig
from gateway.sse import SseScanner
from gateway.usage_privacy import drops_cached, plain_without_cached
from tenancy.registry import TenantConfigError
from tenancy.tenant import parse_tenant

TD = "demo.prefixgate.test"
PROMPT = " ".join(f"u{i}" for i in range(200))  # 12 blocks of 16 tokens: a repeat hits the cache


def tenants(a_setting: str | None) -> list[dict[str, Any]]:
    a: dict[str, Any] = {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"],
                         "pools": ["default"], "max_output_tokens": 256}
    if a_setting is not None:
        a["usage_cached_tokens"] = a_setting
    return [a, {"id": "tenant-b", "spiffe_ids": [f"spiffe://{TD}/tenant-b/"], "models": ["sim-model"],
                "pools": ["default"], "max_output_tokens": 256}]


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    """tenant-a passes the counter on, tenant-b takes the default (drop)."""
    return {"tenancy": {"tenants": tenants("pass")}}


def capture(stack: Any, monkeypatch: Any) -> list[Any]:
    events: list[Any] = []
    hub = stack.components.audit
    emit = hub.emit_request
    monkeypatch.setattr(hub, "emit_request", lambda rec: (events.append(rec), emit(rec))[1])
    return events


async def twice(stack: Any, workload: str, path: str, body: dict[str, Any]) -> list[Any]:
    """The same request twice (the second hits the tenant's own cache); the answers."""
    out = []
    for _ in range(2):
        r = await stack.client.post(path, headers=stack.auth(workload), json=body)
        assert r.status_code == 200, r.text
        out.append(r)
    return out


def stream_usage(text: str) -> dict[str, Any]:
    chunks = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
    usages = [c["usage"] for c in chunks if c.get("usage")]
    assert len(usages) == 1
    return usages[0]


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"model": "sim-model", "prompt": PROMPT, "max_tokens": 2}),
    ("/v1/chat/completions", {"model": "sim-model", "messages": [{"role": "user", "content": PROMPT}],
                              "max_tokens": 2}),
])
async def test_default_answer_has_no_cached_tokens_and_audit_keeps_it(stack: Any, monkeypatch: Any,
                                                                       path: str, body: dict[str, Any]) -> None:
    events = capture(stack, monkeypatch)
    answers = await twice(stack, "tenant-b/app", path, body)
    for r in answers:
        usage = r.json()["usage"]
        assert "prompt_tokens_details" not in usage and "cached_tokens" not in r.text
        assert usage["prompt_tokens"] > 0 and r.headers["content-length"] == str(len(r.content))
    assert events[-1].tenant_id == "tenant-b" and events[-1].delivered_prefix_tokens >= 176  # the true value

    streamed = await twice(stack, "tenant-b/app", path, {**body, "stream": True,
                                                         "stream_options": {"include_usage": True}})
    for r in streamed:
        assert "prompt_tokens_details" not in stream_usage(r.text) and "cached_tokens" not in r.text
    assert events[-1].stream and events[-1].delivered_prefix_tokens >= 176


async def test_pass_keeps_the_counter(stack: Any, monkeypatch: Any) -> None:
    events = capture(stack, monkeypatch)
    body = {"model": "sim-model", "prompt": PROMPT + " pass", "max_tokens": 2}
    second = (await twice(stack, "tenant-a/app", "/v1/completions", body))[1]
    cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 176 and events[-1].delivered_prefix_tokens == cached
    streamed = (await twice(stack, "tenant-a/app", "/v1/completions",
                            {**body, "stream": True, "stream_options": {"include_usage": True}}))[1]
    assert stream_usage(streamed.text)["prompt_tokens_details"]["cached_tokens"] >= 176


def test_setting_per_tenant_with_a_global_default() -> None:
    assert TenancyConfig().usage_cached_tokens == "drop"  # fail closed
    assert drops_cached(None, "drop") and not drops_cached(None, "pass")
    assert drops_cached("drop", "pass") and not drops_cached("pass", "drop")
    assert parse_tenant(tenants("pass")[0], 0).usage_cached_tokens == "pass"
    assert parse_tenant(tenants(None)[0], 0).usage_cached_tokens is None
    with pytest.raises(TenantConfigError, match=r"tenants\.0\.usage_cached_tokens: must be 'pass' or 'drop'"):
        parse_tenant(tenants("own_only")[0], 0)


@pytest.mark.parametrize("data", [
    # a string holding the key's bytes before the real usage; the real usage's order and spacing
    b'{"id":"x","choices":[{"text":"\\"usage\\": {\\"a\\":1}"}],"usage": {"prompt_tokens":5,'
    b'"prompt_tokens_details":{"cached_tokens":3},"completion_tokens":2},"kv_transfer_params":null}',
    # other details are kept
    b'{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"audio_tokens":0,"cached_tokens":3}}}',
    # a key written with an escape cannot be located: the whole answer is written again
    b'{"choices":[],"us\\u0061ge":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens": 3}}}',
    # the compact shape with an escaped usage key: written again whole too (session 14, RV2-1: with an
    # escape in the bytes, the byte guards cannot tell which object a client reads)
    b'{"choices":[],"us\\u0061ge":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":3}}}',
    # a later object named usage with other figures (top_logprobs keys are token texts)
    b'{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":3}},"x":{"usage":{"a":1}}}',
])
def test_plain_answer_loses_only_the_counter(data: bytes) -> None:
    obj = orjson.loads(data)
    out = plain_without_cached(data, obj, obj["usage"])
    back = orjson.loads(out)
    assert "cached_tokens" not in json.dumps(back["usage"])
    expected = dict(obj)
    usage = {k: v for k, v in obj["usage"].items() if k != "prompt_tokens_details"}
    rest = {k: v for k, v in obj["usage"]["prompt_tokens_details"].items() if k != "cached_tokens"}
    if rest:
        usage = {k: rest if k == "prompt_tokens_details" else v for k, v in obj["usage"].items()}
    expected["usage"] = usage
    assert back == expected
    if b'{"cached_tokens":3}' in data and b'"x"' not in data and b"\\u" not in data:  # vLLM's shape: cut
        assert out == data.replace(b',"prompt_tokens_details":{"cached_tokens":3}', b"")
    elif data.startswith(b'{"id"') or b"audio" in data:  # located: the bytes before the usage object are kept
        assert out.startswith(data[:data.rindex(b'"usage"')])
    else:  # not located with certainty (an escaped key; the last object named usage is another): rewritten
        assert out == orjson.dumps(expected)


def test_plain_answer_without_the_field_is_the_same_object() -> None:
    data = b'{"usage":{"prompt_tokens":5,"completion_tokens":1}}'
    obj = orjson.loads(data)
    assert plain_without_cached(data, obj, obj["usage"]) is data


@pytest.mark.parametrize("sep", [b"\n", b"\r\n"])
def test_stream_usage_chunk_rewritten_split_anywhere(sep: bytes) -> None:
    events = [b'data: {"choices":[{"text":"a"}]}', b": comment",
              b'data: {"choices":[],"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":3}}}',
              b"data: [DONE]"]
    stream = b"".join(e + sep + sep for e in events)
    for cut in range(1, len(stream)):
        sc = SseScanner(drop_cached=True)
        out = sc.feed(stream[:cut]) + sc.feed(stream[cut:]) + sc.finish()
        assert b"cached_tokens" not in out and sc.usage["prompt_tokens_details"]["cached_tokens"] == 3
        assert b'data: {"choices":[],"usage":{"prompt_tokens":5}}\n\n' in out
        assert out.count(b"data: ") == 3 and sc.output_tokens == 1
        assert out.replace(b"\r\n", b"\n").count(b"\n\n") == 4  # no extra blank line
    sc = SseScanner()  # pass: byte for byte
    assert sc.feed(stream) == stream


@pytest.mark.parametrize("data", [
    # a nested copy of the usage after the real one (the last "usage" key is not the top-level one)
    b'{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens": 3}},'
    b'"x":{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens": 3}}}}',
    # a duplicated top-level key: parsers differ on which one wins, so neither may keep the counter
    b'{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":3}},'
    b'"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":3}}}',
    b'{"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens": 3}},'
    b'"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens": 3}}}',
])
def test_no_top_level_usage_a_client_may_read_keeps_the_counter(data: bytes) -> None:
    """R12b-4: the rewrite located the last ``"usage"`` key; when that is not the object a client reads,
    the whole answer is written again."""
    obj = orjson.loads(data)
    out = plain_without_cached(data, obj, obj["usage"])
    top = json.loads(out, object_pairs_hook=lambda kv: kv)  # the top level's pairs, in order, duplicates kept
    assert [k for k, _ in top].count("usage") == 1
    assert all("cached_tokens" not in json.dumps(v) for k, v in top if k == "usage")
