"""Session 22, fixschema: bodies refused before the costly steps or before a replica sees them.

S22-review-4: a chat body whose ``tools`` held 30,000 one-key objects (360 kB, under ``max_json_items``) was
validated, walked for nesting, dumped and rendered to JSON (~110 ms of gateway CPU) before it was refused
``context_length_exceeded``. ``limits.max_tools`` (default 128, OpenAI's documented bound) now refuses a longer
``tools`` list 400 ``too_many_tools`` right after decoding; one tool's ``parameters`` could still carry 60,000
values, so the free-form fields' count of JSON values is bounded too (``RequestBounds.max_free_values``, derived
from the prompt bounds: 400 ``too_many_json_items``), refusing only bodies the prompt bounds refused later. S22-newcomer-4: ``stream_options`` with ``stream``
false, and a message with null content that is not an assistant's with ``tool_calls``, were accepted and
forwarded; a strict engine (OpenAI, vLLM) refuses both, so the client got 400 ``upstream_rejected`` after
admission. Both are now 400 ``invalid_request`` naming the field, on the schema path and on the fast path
(gateway/request_fast.py defers them to pydantic).
"""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from gateway.config_http import LimitsConfig
from gateway.errors import GatewayError
from gateway.request import parse_inference_request
from gateway.request_fast import plain_chat, plain_completion
from gateway.admission import Admission
from gateway.admission_front import parse_and_count
from gateway.config_state import StateConfig
from gateway.free_form import count_values, free_form_refusal
from gateway.metrics import GatewayMetrics
from gateway.request_schema import ChatBody, CompletionBody
from tenancy.bounds import request_bounds
from tenancy.registry import Tenant, TenantRegistry
from tenancy.shared import make_limits
from tenancy.tokenizer import WordTokenizer

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
    assert free_form_refusal({"tools": "x" * 500}, 1, None, 600) is None  # not a list: the schema's answer stands
    assert free_form_refusal({"tools": [{}] * 3}, None, None, 20) is None
    assert free_form_refusal({}, 1, 1, 2) is None
    assert free_form_refusal({"tools": [{}] * 3}, 2, None, 20).code == "too_many_tools"  # type: ignore[union-attr]


# the free-form fields' count of values -------------------------------------------------------------------

def _params_body(n: int) -> dict[str, Any]:
    """One tool whose ``parameters`` carry about ``2 n`` values (S22-review-4 after max_tools)."""
    return {"model": "m", "messages": MSGS, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {f"k{i}": i for i in range(n)}}}}]}


def _admission(tokens: int) -> Admission:
    return Admission(TenantRegistry.from_config([]), make_limits(StateConfig()), WordTokenizer(), ["m"],
                     GatewayMetrics(), max_messages=64, max_output_tokens=4096, default_max_prompt_tokens=tokens)


def test_default_bounds_word_tokenizer_bound_is_the_prompt_tokens() -> None:
    b = request_bounds(Tenant(id="acme"), WordTokenizer(), max_messages_ceiling=2048, default_max_prompt_tokens=8192)
    assert b.max_free_values == 8192
    own = request_bounds(Tenant(id="acme", max_prompt_tokens=100, max_prompt_bytes=50), WordTokenizer(),
                         max_messages_ceiling=2048, default_max_prompt_tokens=8192)
    assert own.max_free_values == 50  # the tenant's bytes are lower: each value renders at least one byte
    assert request_bounds(Tenant(id="acme"), WordTokenizer(), max_messages_ceiling=2048).max_free_values is None


class _BytesOnly:
    """A tokenizer without ``max_json_values`` (as tenancy.hf_tokenizer's): bounded by bytes only."""
    name = "bytes-only"

    def encode(self, text: str, limit: int | None = None) -> list[int]:
        return list(text.encode())

    def max_text_bytes(self, tokens: int) -> int:
        return 4 * tokens

    def max_messages(self, tokens: int) -> int:
        return max(1, tokens // 10)


def test_a_tokenizer_without_a_value_bound_uses_the_byte_bound() -> None:
    b = request_bounds(Tenant(id="acme"), _BytesOnly(), max_messages_ceiling=2048,  # type: ignore[arg-type]
                       default_max_prompt_tokens=1000)
    assert b.max_free_values == b.max_prompt_bytes is not None


def test_one_tools_parameters_of_60000_values_refused_before_validation() -> None:
    raw = _raw(_params_body(30_000))
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(raw, "chat", 32, max_json_items=65536, max_tools=128, max_free_values=8192)
    assert (exc.value.status, exc.value.code) == (400, "too_many_json_items")
    assert "8192" in exc.value.message and "tools" in exc.value.message


@pytest.mark.parametrize("n", [50, 99, 100, 101, 150])
def test_the_value_bound_refuses_only_what_the_token_bound_refused(n: int) -> None:
    """Through the front step (parse, then tokens): a body the value bound refuses is one the prompt-token
    bound refused before (``context_length_exceeded``), at every size around the bound."""
    adm, tenant = _admission(200), Tenant(id="t", models=frozenset({"m"}))
    bounds = adm.request_bounds(tenant)
    raw = _raw(_params_body(n))
    try:
        parse_and_count(adm, raw, "chat", LimitsConfig(), bounds, tenant, None, False)  # type: ignore[arg-type]
        now = None
    except GatewayError as err:
        now = err.code
    old_bounds = type(bounds)(bounds.max_prompt_tokens, bounds.max_prompt_bytes, bounds.max_messages,
                              bounds.max_batch_prompts)  # no max_free_values: the bound as before
    try:
        parse_and_count(adm, raw, "chat", LimitsConfig(), old_bounds, tenant, None, False)  # type: ignore[arg-type]
        before = None
    except GatewayError as err:
        before = err.code
    assert (now is None) == (before is None)
    if now is not None:
        assert now in ("too_many_json_items", "context_length_exceeded") and before == "context_length_exceeded"
    if count_values([json.loads(raw)["tools"]], 10**9) > bounds.max_free_values:  # type: ignore[operator]
        assert now == "too_many_json_items"  # refused before validation and rendering


_json = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False,
                     allow_infinity=False), st.text(max_size=5)),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                                  max_size=4), max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(tools=st.lists(st.dictionaries(st.text(max_size=4), _json, max_size=3), max_size=3),
       choice=st.one_of(st.none(), st.just("auto"), st.dictionaries(st.text(max_size=3), _json, max_size=2)),
       fmt=st.one_of(st.none(), st.dictionaries(st.text(max_size=3), _json, max_size=2)),
       calls=st.one_of(st.none(), st.lists(st.dictionaries(st.text(max_size=3), _json, max_size=2), max_size=2)))
def test_each_counted_value_renders_a_token_and_a_byte(tools: list, choice: Any, fmt: Any, calls: Any) -> None:
    """The derivation of ``WordTokenizer.max_json_values`` and of the byte bound: the values counted are at most
    the tokens and the bytes of the rendering that the prompt bounds count (``extra_text``)."""
    body: dict[str, Any] = {"model": "m", "messages": [*MSGS]}
    for k, v in (("tools", tools), ("tool_choice", choice), ("response_format", fmt)):
        if v is not None:
            body[k] = v
    if calls is not None:
        body["messages"].append({"role": "assistant", "content": None if calls else "x", "tool_calls": calls})
    data = json.loads(json.dumps(body))
    req = parse_inference_request(json.dumps(body).encode(), "chat", 64)
    roots = [data[k] for k in ("tools", "tool_choice", "response_format") if data.get(k) is not None]
    roots += [m["tool_calls"] for m in data["messages"] if m.get("tool_calls") is not None]
    counted = count_values(roots, 10**9)
    assert counted <= len(WordTokenizer().encode(req.extra_text))
    assert counted <= len(req.extra_text.encode("utf-8"))
    size = len(json.dumps(data).encode())
    assert counted <= size  # so a body of at most max_values bytes needs no walk
    assert free_form_refusal(data, None, counted, size) is None
    if counted:
        assert free_form_refusal(data, None, counted - 1, size) is not None


def test_count_values_stops_past_the_bound() -> None:
    assert count_values([[0] * 10], 100) == 11
    assert count_values([{"a": [1, 2]}], 100) == 5
    assert count_values([[[0] * 1000] * 1000], 50) > 50  # counted no further than the first list's length


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
