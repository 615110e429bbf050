"""Session 20, S20-R3: chat ``content`` given as a list of plain text parts takes the pydantic-free shortcut.

Property: for bodies in and around that shape (wrong part type, extra keys, non-string text, empty lists, nested
lists, nulls, numbers, bools, unicode, many parts), :func:`gateway.request_fast.plain_chat` either declines (None:
pydantic decides, as before) or gives exactly what ``ChatBody.model_validate(data).model_dump(exclude_none=True)``
gives (same keys in the same order, same values and JSON types): it never accepts a body the schema refuses.
:func:`gateway.request.parse_inference_request` returns the same request either way (prompt text, sizes, forwarded
body), counts near ``max_messages`` are refused as before, and through a running gateway such a request is routed,
counted (prompt tokens, prefix fingerprint) and audited as the pydantic path does it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import gateway.request as request_mod
from gateway.request import parse_inference_request
from gateway.request_fast import plain_chat, text_parts
from gateway.request_schema import ChatBody
from tests.gateway.test_s7_request_fast_chat import _schema  # the schema oracle of the chat shortcut
from tests.gateway.test_s7_request_fast_chat import _shortcut_and_schema
from tests.support import audit_log as audit_fixtures
from tests.support.audit_log import ListLog

audit_log, audit_hub = audit_fixtures.audit_log, audit_fixtures.audit_hub  # the stack on a ListLog

_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2, 2), st.floats(allow_nan=False, allow_infinity=False),
                     st.text(max_size=4))
_texts = st.one_of(st.text(max_size=6), st.sampled_from(["", "é", "日本語", "\U0001f600 x", "a\nb", "\u0301"]))
# a text part and its near misses: other type values, missing or extra keys, non-string text, nesting
_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": _texts}),
    st.fixed_dictionaries({"text": _texts, "type": st.just("text")}),  # the other key order
    st.fixed_dictionaries({"type": st.one_of(st.sampled_from(["image_url", "Text", "text ", "input_audio", ""]),
                                             _scalars), "text": _texts}),
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(_scalars, st.lists(st.text(max_size=2),
                                                                                        max_size=2))}),
    st.fixed_dictionaries({"type": st.just("text")}, optional={"text": _texts, "extra": _scalars,
                                                              "image_url": st.just({"url": "x"})}),
    st.fixed_dictionaries({"text": _texts}),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": _texts}), max_size=2),  # nested list
    _scalars,
)
_content = st.one_of(st.lists(_part, max_size=4), st.lists(st.just({"type": "text", "text": "w"}), max_size=40),
                     st.just([]), st.just([[]]), st.text(max_size=4), st.none(), st.integers(0, 1), st.booleans(),
                     st.fixed_dictionaries({"type": st.just("text"), "text": _texts}))
_message = st.fixed_dictionaries(
    {"role": st.one_of(st.sampled_from(["system", "developer", "user", "assistant", "tool", "User", "function"]),
                       _scalars)},
    optional={"content": _content, "name": st.one_of(st.none(), st.text(max_size=3)), "extra": _scalars})
_chat = st.fixed_dictionaries(
    {"model": st.one_of(st.text(min_size=1, max_size=5), st.just(""), st.none()),
     "messages": st.one_of(st.lists(st.one_of(_message, _scalars), max_size=3), st.none(), st.just([]))},
    optional={"max_tokens": st.one_of(st.integers(-1, 3), st.none(), st.booleans()),
              "stream": st.one_of(st.booleans(), st.none()),
              "stream_options": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
                  "include_usage": st.one_of(st.booleans(), st.none(), st.integers(0, 1))})),
              "cache_salt": _scalars})
_valid_part = st.fixed_dictionaries({"type": st.just("text"), "text": _texts})
_valid_chat = st.fixed_dictionaries(
    {"model": st.text(min_size=1, max_size=5), "messages": st.lists(st.fixed_dictionaries(
        # a tool message needs tool_call_id (session 24, S23-newcomer-9): it goes to pydantic
        {"role": st.sampled_from(["system", "developer", "user", "assistant"]),
         "content": st.one_of(st.lists(_valid_part, max_size=5), _texts)},  # null: S22-newcomer-4
        optional={"extra": _scalars}), min_size=1, max_size=4)},
    optional={"max_tokens": st.one_of(st.integers(1, 3), st.none()), "stream": st.booleans(), "cache_salt": _scalars})


@settings(max_examples=1500, deadline=None)
@given(st.one_of(_chat, _valid_chat))
def test_parts_shortcut_equals_the_schema_or_declines(data: dict[str, Any]) -> None:
    data = json.loads(json.dumps(data))  # what the parser hands it: a decoded JSON object
    fast = plain_chat(data)
    if fast is None:
        return
    want = _schema(data)
    assert want is not None, "the shortcut accepted a body the schema refuses"
    assert json.dumps(fast) == json.dumps(want)  # same keys, order, values and JSON types
    assert fast == want


@settings(max_examples=300, deadline=None)
@given(_valid_chat)
def test_valid_text_parts_always_take_the_shortcut(data: dict[str, Any]) -> None:
    data = json.loads(json.dumps(data))
    assert plain_chat(data) == _schema(data) is not None


@pytest.mark.parametrize("content", [
    [{"type": "image_url", "text": "x"}],
    [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}],  # extra key: the schema decides
    [{"type": "text"}],
    [{"text": "x"}],
    [{"type": "text", "text": 1}],
    [{"type": "text", "text": None}],
    [{"type": "text", "text": True}],
    [{"type": "text", "text": ["x"]}],
    [[{"type": "text", "text": "x"}]],
    [None],
    ["x"],
    [{"type": "text", "text": "ok"}, 3],
])
def test_near_misses_decline(content: list[Any]) -> None:
    assert text_parts(content) is None
    assert plain_chat({"model": "m", "messages": [{"role": "user", "content": content}]}) is None


def test_parts_dump_in_schema_order_as_new_objects() -> None:
    part = {"text": "é", "type": "text"}
    out = text_parts([part])
    assert out == [{"type": "text", "text": "é"}] and list(out[0]) == ["type", "text"]  # type: ignore[index]
    assert out[0] is not part  # type: ignore[index]
    assert text_parts([]) == []


_DOCS = [
    {"model": "sim-model", "messages": [{"role": "user", "content": [{"type": "text", "text": "a b"},
                                                                    {"type": "text", "text": "c"}]}], "max_tokens": 3},
    {"model": "sim-model", "messages": [{"role": "system", "content": "be brief"},
                                        {"role": "user", "content": [{"text": "日本 \U0001f600", "type": "text"}]},
                                        {"role": "assistant", "content": []}, {"role": "user", "content": "d"}],
     "stream": True, "stream_options": {"include_usage": True}, "cache_salt": "s"},
    {"model": "sim-model", "messages": [{"role": "user", "content": [{"type": "text", "text": f"w{i}"}
                                                                    for i in range(1600)]}]},
]


@pytest.mark.parametrize("doc", _DOCS)
def test_parse_does_not_call_pydantic_and_matches_it(monkeypatch: pytest.MonkeyPatch, doc: dict[str, Any]) -> None:
    fast, slow = _shortcut_and_schema(monkeypatch, json.dumps(doc).encode(), 2000)
    assert fast == slow and json.dumps(fast.body) == json.dumps(slow.body)
    assert fast.text == slow.text and fast.prompt_bytes == slow.prompt_bytes and fast.extra_text == slow.extra_text


@pytest.mark.parametrize("parts, messages, code", [
    (2000, 1, None), (2001, 1, "too_many_content_parts"),
    (1, 2000, None), (1, 2001, "too_many_messages"), (2, 1000, None), (2, 1001, "too_many_content_parts"),
])
def test_counts_near_max_messages(parts: int, messages: int, code: str | None) -> None:
    doc = {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "w"}] * parts}] * messages}
    raw = json.dumps(doc).encode()
    if code is None:
        req = parse_inference_request(raw, "chat", max_messages=2000)
        assert req.body == _schema(doc)
        return
    with pytest.raises(request_mod.GatewayError) as err:
        parse_inference_request(raw, "chat", max_messages=2000)
    assert (err.value.status, err.value.code) == (400, code)


@pytest.mark.parametrize("content", [
    [{"type": "image_url", "image_url": {"url": "http://x"}}],
    [{"type": "text", "text": 1}],
    [{"type": "text"}],
    [[{"type": "text", "text": "x"}]],
    [None],
    {"type": "text", "text": "x"},
])
def test_refusals_are_unchanged(content: Any) -> None:
    doc = {"model": "m", "messages": [{"role": "user", "content": content}]}
    with pytest.raises(request_mod.GatewayError) as err:
        parse_inference_request(json.dumps(doc).encode(), "chat")
    with pytest.raises(ValidationError) as exc:
        ChatBody.model_validate(doc)
    msg, loc = request_mod.schema_error(exc.value)
    assert (err.value.status, err.value.code, err.value.message) == (400, "invalid_request", msg)


async def _events(log: Any, n: int) -> list[Any]:
    """The first ``n`` request events of ``log`` (waits for them, at most 10 s)."""
    async with asyncio.timeout(10):
        while len(evs := [e for e in log.events if getattr(e, "request_id", None)]) < n:
            await asyncio.sleep(0.01)
    return evs[:n]


async def test_parts_request_routed_counted_and_audited_as_before(stack: Any, audit_log: ListLog,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    words = [f"w{i}" for i in range(200)]
    doc = {"model": "sim-model", "max_tokens": 4,
           "messages": [{"role": "system", "content": "be brief"},
                        {"role": "user", "content": [{"type": "text", "text": w} for w in words]}]}
    auth = {"Authorization": f"Bearer {stack.token()}"}
    taken: list[bool] = []
    real = request_mod.plain_chat
    monkeypatch.setattr(request_mod, "plain_chat", lambda data, *a: taken.append(True) or real(data, *a))
    fast = await stack.client.post("/v1/chat/completions", headers=auth, json=doc)
    assert fast.status_code == 200, fast.text
    monkeypatch.setattr(request_mod, "plain_chat", lambda data, *a: taken.append(False) or None)  # pydantic path
    slow = await stack.client.post("/v1/chat/completions", headers=auth, json=doc)
    assert slow.status_code == 200, slow.text
    assert taken == [True, False]
    one, two = await _events(audit_log, 2)
    assert one.outcome == two.outcome == "allowed" and one.tenant == two.tenant
    # 1 + 2 + 1 + 200 rendered tokens: "<|system|>" and "<|user|>" are 5 tokens each (tenancy/tokenizer.py)
    assert one.prompt_tokens == two.prompt_tokens == 5 + 2 + 5 + 200
    assert one.prefix_fingerprint and one.prefix_fingerprint == two.prefix_fingerprint  # same prefix keys
    assert one.route.replica == two.route.replica  # the second finds the first's prefix: same replica
    assert two.route.predicted_prefix_tokens and two.route.predicted_prefix_tokens > 0
    assert fast.json()["usage"]["prompt_tokens"] == slow.json()["usage"]["prompt_tokens"]
