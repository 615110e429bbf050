"""Malformed and abusive request bodies: each gets its exact status and OpenAI-style error body,
nothing reaches a replica, and no replica's health is touched."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.replicas import CircuitState

LONG = " ".join(f"w{i}" for i in range(64))
JSON = {"content-type": "application/json"}


def _nest(depth: int) -> dict[str, Any]:
    inner: dict[str, Any] = {"leaf": 1}
    for _ in range(depth - 1):
        inner = {"k": inner}
    return inner


# (name, endpoint, raw body, status, code, type, param, message substring)
CASES: list[tuple[str, str, bytes, int, str, str, str | None, str]] = [
    ("invalid_json", "completions", b"{not json", 400, "invalid_json", "invalid_request_error", None,
     "request body is not valid JSON"),
    ("truncated", "completions", b'{"model": "sim-model", "prompt": "hello wor', 400, "invalid_json",
     "invalid_request_error", None, "request body is not valid JSON"),
    ("empty_body", "completions", b"", 400, "invalid_json", "invalid_request_error", None,
     "request body is not valid JSON"),
    ("not_an_object", "chat", b'[{"role": "user", "content": "hi"}]', 400, "invalid_json",
     "invalid_request_error", None, "request body must be a JSON object"),
    ("non_utf8", "completions", b'{"model": "sim-model", "prompt": "\xff\xfe\xfa"}', 400, "invalid_json",
     "invalid_request_error", None, "request body is not valid UTF-8"),
    ("deep_object", "chat",  # s6 R6-1: the bound applies to forwarded free-form fields; unknown ones are dropped unread
     json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": "x"}],
                 # tool_choice: a deep response_format meets limits.json_schema.max_depth first (session 24)
                 "tool_choice": _nest(40)}).encode(), 400, "invalid_json",
     "invalid_request_error", None, "nested deeper than 32"),
    ("deep_array_recursion", "completions", b'{"model": "sim-model", "x": ' + b"[" * 30000 + b"]" * 30000 + b"}",
     400, "invalid_json", "invalid_request_error", None, "nested"),
    ("messages_string", "chat", b'{"model": "sim-model", "messages": "hi there"}', 400, "invalid_request",
     "invalid_request_error", "messages", "messages"),
    ("messages_empty", "chat", b'{"model": "sim-model", "messages": []}', 400, "invalid_request",
     "invalid_request_error", "messages", "messages"),
    ("bad_role", "chat", b'{"model": "sim-model", "messages": [{"role": "root", "content": "x"}]}', 400,
     "invalid_request", "invalid_request_error", "messages.0.role", "messages.0.role"),
    ("max_tokens_negative", "completions", b'{"model": "sim-model", "prompt": "x", "max_tokens": -3}', 400,
     "invalid_request", "invalid_request_error", "max_tokens", "max_tokens"),
    ("max_tokens_zero", "completions", b'{"model": "sim-model", "prompt": "x", "max_tokens": 0}', 400,
     "invalid_request", "invalid_request_error", "max_tokens", "max_tokens"),
    ("max_tokens_huge", "completions",
     b'{"model": "sim-model", "prompt": "x", "max_tokens": 100000000000000000000000000000}', 400,
     "number_too_long", "invalid_request_error", None, "more than 20 digits"),  # s4 R4-2: refused undecoded
    ("max_tokens_string", "completions", b'{"model": "sim-model", "prompt": "x", "max_tokens": "12"}', 400,
     "invalid_request", "invalid_request_error", "max_tokens", "max_tokens"),
    ("max_tokens_float", "completions", b'{"model": "sim-model", "prompt": "x", "max_tokens": 12.0}', 400,
     "invalid_request", "invalid_request_error", "max_tokens", "max_tokens"),
    ("max_tokens_bool", "completions", b'{"model": "sim-model", "prompt": "x", "max_tokens": true}', 400,
     "invalid_request", "invalid_request_error", "max_tokens", "max_tokens"),
    ("n_float", "completions", b'{"model": "sim-model", "prompt": "x", "n": 1.5}', 400, "invalid_request",
     "invalid_request_error", "n", "n"),
    ("n_string", "completions", b'{"model": "sim-model", "prompt": "x", "n": "1"}', 400, "invalid_request",
     "invalid_request_error", "n", "n"),
    ("n_two", "completions", b'{"model": "sim-model", "prompt": "x", "n": 2}', 400, "invalid_request",
     "invalid_request_error", "n", "n"),
    ("stream_string", "completions", b'{"model": "sim-model", "prompt": "x", "stream": "yes"}', 400,
     "invalid_request", "invalid_request_error", "stream", "stream"),
    ("model_missing", "completions", b'{"prompt": "x"}', 400, "invalid_request", "invalid_request_error",
     "model", "model"),
    ("model_number", "completions", b'{"model": 7, "prompt": "x"}', 400, "invalid_request",
     "invalid_request_error", "model", "model"),
    ("prompt_missing", "completions", b'{"model": "sim-model"}', 400, "invalid_request",
     "invalid_request_error", "prompt", "prompt"),
    ("empty_prompt", "completions", b'{"model": "sim-model", "prompt": ""}', 400, "invalid_request",
     "invalid_request_error", "prompt", "prompt must not be empty"),
    ("empty_prompt_list", "completions", b'{"model": "sim-model", "prompt": ["", ""]}', 400, "invalid_request",
     "invalid_request_error", "prompt", "prompt must not be empty"),
    ("whitespace_prompt", "completions", b'{"model": "sim-model", "prompt": "   \\n\\t "}', 400,
     "invalid_request", "invalid_request_error", "prompt", "prompt must not be empty"),
    ("stream_int", "chat", b'{"model": "sim-model", "messages": [{"role": "user", "content": "x"}], "stream": 1}',
     400, "invalid_request", "invalid_request_error", "stream", "stream"),
    ("content_number", "chat", b'{"model": "sim-model", "messages": [{"role": "user", "content": 42}]}',
     400, "invalid_request", "invalid_request_error", "messages.0.content", "messages.0.content"),  # s23: param
    # without the union branch; the message keeps it (messages.0.content.str: ...)
    ("seed_out_of_range", "completions", b'{"model": "sim-model", "prompt": "x", "seed": 1e400}', 400,
     "invalid_json", "invalid_request_error", None, "number out of range"),  # S21-fixnew-2: not a double
    ("seed_huge_int", "completions",
     b'{"model": "sim-model", "prompt": "x", "seed": 100000000000000000000000000000000}', 400,
     "number_too_long", "invalid_request_error", None, "more than 20 digits"),  # s4 R4-2
    ("seed_just_over_64_bits", "completions", b'{"model": "sim-model", "prompt": "x", "seed": 18446744073709551616}',
     400, "invalid_request", "invalid_request_error", "seed", "seed"),
    ("temperature_out_of_range", "completions", b'{"model": "sim-model", "prompt": "x", "temperature": 9}',
     400, "invalid_request", "invalid_request_error", "temperature", "temperature"),
    ("too_many_stops", "completions",
     b'{"model": "sim-model", "prompt": "x", "stop": ["a", "b", "c", "d", "e"]}', 400, "invalid_request",
     "invalid_request_error", "stop", "stop"),
    ("nan_literal", "completions", b'{"model": "sim-model", "prompt": "x", "temperature": NaN}', 400,
     "invalid_json", "invalid_request_error", None, "NaN is not a JSON value"),  # S21-newcomer-5: not JSON
    ("unknown_model", "completions", b'{"model": "gpt-17", "prompt": "x"}', 404, "model_not_found",
     "invalid_request_error", "model", "the requested model does not exist"),
    ("over_tenant_prompt_limit", "completions",
     json.dumps({"model": "sim-model", "prompt": "w " * 4001}).encode(), 400, "context_length_exceeded",
     "invalid_request_error", None, "this tenant's limit is 4000"),
]


def _path(endpoint: str) -> str:
    return "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"


@pytest.mark.parametrize("name,endpoint,raw,status,code,etype,param,msg", CASES, ids=[c[0] for c in CASES])
async def test_malformed_body_exact_error(stack, capture, name, endpoint, raw, status, code, etype, param, msg):
    r = await stack.client.post(_path(endpoint), content=raw, headers={**stack.auth(), **JSON})
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert {"message", "type", "code", "param"} <= set(err)
    assert err["code"] == code and err["type"] == etype and err["param"] == param
    assert msg in err["message"]
    # the error never echoes the offending value back
    assert "hello wor" not in err["message"] and "gpt-17" not in err["message"]
    assert capture.seen == []  # nothing reached a replica
    rs = stack.components.replica_set
    for rid in ("r0", "r1", "r2"):
        st = rs.state(rid)
        assert st.healthy and st.consecutive_failures == 0 and st.circuit is CircuitState.CLOSED
    assert stack.components.limiter.in_flight("tenant-a") == 0


async def test_huge_max_tokens_within_ceiling_is_clamped_not_forwarded_raw(stack, capture):
    r = await stack.client.post("/v1/completions", headers=stack.auth(),
                                json={"model": "sim-model", "prompt": LONG, "max_tokens": 1 << 20})
    assert r.status_code == 200, r.text
    assert [c.body["max_tokens"] for c in capture.seen] == [256]  # tenant-a's max_output_tokens


async def test_body_over_cap_via_client_is_413(stack, capture):
    big = json.dumps({"model": "sim-model", "prompt": "a " * 40000}).encode()
    assert len(big) > 65536
    r = await stack.client.post("/v1/completions", content=big, headers={**stack.auth(), **JSON})
    assert r.status_code == 413
    assert r.json() == {"error": {"message": "request body exceeds 65536 bytes", "type": "invalid_request_error",
                                  "code": "body_too_large", "param": None}}
    assert capture.seen == []


async def test_two_authorization_headers_400(stack, capture):
    tok_a, tok_b = stack.token("tenant-a/app"), stack.token("tenant-b/app")
    headers = [("authorization", f"Bearer {tok_a}"), ("authorization", f"Bearer {tok_b}"),
               ("content-type", "application/json")]
    r = await stack.client.post("/v1/completions", headers=headers,
                                json={"model": "sim-model", "prompt": LONG})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "malformed_authorization_header" and err["type"] == "invalid_request_error" or \
        err["code"] == "malformed_authorization_header"
    assert "Bearer" in r.headers.get("www-authenticate", "")
    assert tok_a not in r.text and tok_b not in r.text
    assert capture.seen == []
