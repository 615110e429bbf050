"""Session 22, fixschema: bodies refused before the costly steps or before a replica sees them.

S22-review-4: a chat body whose ``tools`` held 30,000 one-key objects (360 kB, under ``max_json_items``) was
validated, walked for nesting, dumped and rendered to JSON (~110 ms of gateway CPU) before it was refused
``context_length_exceeded``. ``limits.max_tools`` (default 128, OpenAI's documented bound) now refuses a longer
``tools`` list 400 ``too_many_tools`` right after decoding. S22-newcomer-4: ``stream_options`` with ``stream``
false, and a message with null content that is not an assistant's with ``tool_calls``, were accepted and
forwarded; a strict engine (OpenAI, vLLM) refuses both, so the client got 400 ``upstream_rejected`` after
admission. Both are now 400 ``invalid_request`` naming the field, on the schema path and on the fast path
(gateway/request_fast.py defers them to pydantic).
"""
from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from gateway.config_http import LimitsConfig
from gateway.errors import GatewayError
from gateway.request import parse_inference_request
from gateway.request_fast import plain_chat, plain_completion
from gateway.request_schema import ChatBody, CompletionBody, too_many_tools

MSGS = [{"role": "user", "content": "hi"}]


def _raw(body: dict[str, Any]) -> bytes:
    return json.dumps(body).encode()


def _tool(i: int) -> dict[str, Any]:
    return {"type": "function", "function": {"name": f"f{i}", "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}}}


def test_default_max_tools_is_openais_128() -> None:
    assert LimitsConfig().max_tools == 128
    assert LimitsConfig(max_tools=None).max_tools is None
    with pytest.raises(ValidationError):
        LimitsConfig(max_tools=0)


def test_review_4_body_refused_too_many_tools_naming_the_field() -> None:
    raw = _raw({"model": "m", "messages": MSGS, "tools": [{"a": "b"}] * 30_000})
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(raw, "chat", 32, max_json_items=65536, max_tools=128)
    assert (exc.value.status, exc.value.code, exc.value.param) == (400, "too_many_tools", "tools")
    assert "30000" in exc.value.message and "128" in exc.value.message
    # before this change (no bound) the same body parsed, to be refused only after tokenizing
    assert parse_inference_request(raw, "chat", 32, max_json_items=65536, max_tools=None).extra_text


def test_tools_checked_before_schema_validation() -> None:
    # items the schema would refuse: the count answers first, so no item is validated
    raw = _raw({"model": "m", "messages": MSGS, "tools": [1] * 200})
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(raw, "chat", 32, max_tools=128)
    assert exc.value.code == "too_many_tools"


@pytest.mark.parametrize("n", [0, 1, 4, 128])
def test_ordinary_tool_bodies_unchanged(n: int) -> None:
    body = {"model": "m", "messages": MSGS, "tools": [_tool(i) for i in range(n)], "tool_choice": "auto"}
    got = parse_inference_request(_raw(body), "chat", 32, max_json_items=65536, max_tools=128)
    unbounded = parse_inference_request(_raw(body), "chat", 32, max_json_items=65536)
    assert got.body == unbounded.body and got.extra_text == unbounded.extra_text
    assert got.body["tools"] == body["tools"]


def test_too_many_tools_reads_only_a_list() -> None:
    assert too_many_tools({"tools": "x" * 500}, 1) is None  # not a list: the schema's answer stands
    assert too_many_tools({"tools": [{}] * 3}, None) is None
    assert too_many_tools({}, 1) is None
    assert too_many_tools({"tools": [{}] * 3}, 2) is not None


# S22-newcomer-4 -------------------------------------------------------------------------------------------

REFUSED = [
    ("chat", {"model": "m", "messages": MSGS, "stream_options": {"include_usage": True}}, "stream_options"),
    ("chat", {"model": "m", "messages": MSGS, "stream": False, "stream_options": {}}, "stream_options"),
    ("completions", {"model": "m", "prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ("chat", {"model": "m", "messages": [{"role": "user", "content": None}]}, "content"),
    ("chat", {"model": "m", "messages": [{"role": "user"}]}, "content"),
    ("chat", {"model": "m", "messages": [{"role": "system", "content": None}, *MSGS]}, "content"),
    ("chat", {"model": "m", "messages": [*MSGS, {"role": "assistant", "content": None}]}, "content"),
    ("chat", {"model": "m", "messages": [*MSGS, {"role": "assistant", "content": None, "tool_calls": []}]},
     "content"),
    ("chat", {"model": "m", "messages": [*MSGS, {"role": "tool", "tool_call_id": "c1"}]}, "content"),
]


@pytest.mark.parametrize("endpoint, body, field", REFUSED)
def test_newcomer_4_refused_invalid_request_naming_the_field(endpoint: str, body: dict, field: str) -> None:
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(_raw(body), endpoint)  # type: ignore[arg-type]
    assert (exc.value.status, exc.value.code) == (400, "invalid_request")
    assert field in exc.value.message
    fast = plain_chat(body) if endpoint == "chat" else plain_completion(body)
    assert fast is None  # the shortcut defers; pydantic's refusal stands


ACCEPTED = [
    ("chat", {"model": "m", "messages": MSGS, "stream": True, "stream_options": {"include_usage": True}}),
    ("chat", {"model": "m", "messages": MSGS, "stream": False, "stream_options": None}),
    ("completions", {"model": "m", "prompt": "x", "stream": True, "stream_options": {}}),
    ("chat", {"model": "m", "messages": [*MSGS, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]}),
    ("chat", {"model": "m", "messages": [*MSGS, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
    ("chat", {"model": "m", "messages": [{"role": "user", "content": ""}]}),
]


@pytest.mark.parametrize("endpoint, body", ACCEPTED)
def test_newcomer_4_valid_forms_still_pass(endpoint: str, body: dict) -> None:
    req = parse_inference_request(_raw(body), endpoint)  # type: ignore[arg-type]
    model = ChatBody if endpoint == "chat" else CompletionBody
    want = model.model_validate(body).model_dump(exclude_none=True)
    want.pop("n")
    assert req.body == want
