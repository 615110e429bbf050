"""Session 7, issue 14: the plainest chat body (messages of role + string content) validated without
pydantic, with the same result as the schema or a decline (then pydantic decides, as before)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import gateway.request as request_mod
from gateway.request import parse_inference_request
from gateway.request_fast import plain_chat
from gateway.request_schema import ChatBody

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.floats(allow_nan=False, allow_infinity=False),
                     st.text(max_size=4))
_message = st.fixed_dictionaries(
    {}, optional={"role": st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool",
                                                     "User", "function", ""]), _scalars),
                  "content": st.one_of(st.text(max_size=6), st.none(), st.integers(0, 1),
                                       st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=3)}),
                                                max_size=1)),
                  "name": st.one_of(st.none(), st.text(max_size=3)),
                  "tool_calls": st.one_of(st.none(), st.just([])),
                  "extra": _scalars})
_chat = st.fixed_dictionaries(
    {"model": st.one_of(st.text(min_size=1, max_size=5), st.just(""), st.none()),
     "messages": st.one_of(st.lists(st.one_of(_message, _scalars), max_size=3), st.none(), st.text(max_size=2))},
    optional={"max_tokens": st.one_of(st.integers(-1, 3), st.none(), st.booleans()),
              "stream": st.one_of(st.booleans(), st.none(), st.integers(0, 1)),
              "stream_options": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
                  "include_usage": st.one_of(st.booleans(), st.none(), st.integers(0, 1))})),
              "max_completion_tokens": st.one_of(st.none(), st.integers(0, 3)),
              "tools": st.one_of(st.none(), st.just([])),
              "user": st.one_of(st.none(), st.text(max_size=2)),
              "cache_salt": _scalars})


_valid_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"])},
    optional={"content": st.one_of(st.text(max_size=6), st.none()), "extra": _scalars})
_valid_chat = st.fixed_dictionaries(
    {"model": st.text(min_size=1, max_size=5), "messages": st.lists(_valid_message, min_size=1, max_size=3)},
    optional={"max_tokens": st.one_of(st.integers(1, 3), st.none()), "stream": st.booleans(),
              "stream_options": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
                  "include_usage": st.one_of(st.booleans(), st.none()), "x": _scalars})),
              "cache_salt": _scalars, "max_completion_tokens": st.none()})


def _schema(data: dict[str, Any]) -> dict[str, Any] | None:
    try:
        body = ChatBody.model_validate(data).model_dump(exclude_none=True, exclude_unset=False)
    except ValidationError:
        return None
    if body.get("n") == 1:
        body.pop("n")
    return body


@settings(max_examples=800, deadline=None)
@given(st.one_of(_chat, _valid_chat))
def test_chat_shortcut_equals_the_schema_or_declines(data: dict[str, Any]) -> None:
    data = json.loads(json.dumps(data))
    fast = plain_chat(data)
    if fast is None:
        return
    want = _schema(data)
    assert want is not None, "the shortcut accepted a body the schema refuses"
    assert json.dumps(fast) == json.dumps(want)  # same keys, order, values and JSON types
    assert fast == want


@pytest.mark.parametrize("doc", [
    {"model": "sim-model", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
     "max_tokens": 3},
    # S22-newcomer-4: an assistant message without content needs tool_calls (schema): this one has content
    {"model": "sim-model", "messages": [{"role": "user", "content": "a b"}, {"role": "assistant", "content": "c"}],
     "stream": True,
     "stream_options": {"include_usage": True}, "cache_salt": "s"},
])
def test_parse_of_a_plain_chat_body_does_not_call_pydantic_and_matches_it(monkeypatch: pytest.MonkeyPatch,
                                                                         doc: dict[str, Any]) -> None:
    fast, slow = _shortcut_and_schema(monkeypatch, json.dumps(doc).encode(), 8)
    assert fast == slow and list(fast.body) == list(slow.body)


def _shortcut_and_schema(monkeypatch: pytest.MonkeyPatch, raw: bytes, max_messages: int) -> tuple[Any, Any]:
    """``(parse with the chat shortcut, parse with the shortcut off: pydantic)`` of the chat body ``raw``; also
    asserts that a third parse, with pydantic's ``model_validate`` refusing to run, equals the pydantic one (the
    shortcut took the body). ``model_validate`` stays refused for the rest of the test."""
    fast = parse_inference_request(raw, "chat", max_messages=max_messages)
    real = request_mod.plain_chat
    monkeypatch.setattr(request_mod, "plain_chat", lambda data, *a: None)
    slow = parse_inference_request(raw, "chat", max_messages=max_messages)
    monkeypatch.setattr(request_mod, "plain_chat", real)

    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("pydantic called for a body the chat shortcut should take")

    monkeypatch.setattr(request_mod.ChatBody, "model_validate", refuse)
    assert parse_inference_request(raw, "chat", max_messages=max_messages) == slow
    return fast, slow


@pytest.mark.parametrize("doc", [
    {"model": "m", "messages": []},
    {"model": "m", "messages": [{"role": "robot", "content": "x"}]},
    {"model": "m", "messages": [{"content": "x"}]},
    {"model": "m", "messages": [{"role": "user", "content": 3}]},
    {"model": "m", "messages": ["hi"]},
    {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0},
])
def test_chat_refusals_are_unchanged(doc: dict[str, Any]) -> None:
    with pytest.raises(request_mod.GatewayError) as err:
        parse_inference_request(json.dumps(doc).encode(), "chat")
    with pytest.raises(ValidationError) as exc:
        ChatBody.model_validate(doc)
    msg, loc = request_mod.schema_error(exc.value)
    assert (err.value.status, err.value.code, err.value.message) == (400, "invalid_request", msg)
