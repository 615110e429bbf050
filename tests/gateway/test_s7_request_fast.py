"""Session 7, issue 14: the plainest completions body is validated without pydantic, with the same result.

Property: for bodies in and around the shortcut's shape (model, prompt, max_tokens, stream, and
near misses: other types, bounds, nulls, extra fields), :func:`gateway.request_fast.plain_completion`
either declines (None) or gives exactly what the pydantic schema gives (same keys in the same order,
same values and types); it never accepts a body the schema refuses. And
:func:`gateway.request.parse_inference_request` returns the same request either way.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import gateway.request as request_mod
from gateway.request import parse_inference_request
from gateway.request_fast import plain_completion
from gateway.request_schema import MAX_TOKENS_CEILING, CompletionBody

_ints = st.one_of(st.integers(-3, 3), st.integers(MAX_TOKENS_CEILING - 2, MAX_TOKENS_CEILING + 2),
                  st.integers(-(1 << 70), 1 << 70))
_values = st.one_of(st.none(), st.booleans(), _ints, st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=4), st.text(min_size=250, max_size=260), st.just(""),
                    st.lists(st.text(max_size=3), max_size=2), st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))
_keys = st.sampled_from(["model", "prompt", "max_tokens", "stream", "n", "user", "temperature", "x", "echo",
                         "stream_options", "seed", "stop", "logprobs", "top_p"])


def _plain() -> st.SearchStrategy[dict[str, Any]]:
    base = st.fixed_dictionaries(
        {"model": st.one_of(st.text(min_size=1, max_size=8), st.text(min_size=255, max_size=257), st.just(""),
                            st.none(), st.integers()),
         "prompt": st.one_of(st.text(max_size=20), st.lists(st.text(max_size=3), max_size=2), st.none())},
        optional={"max_tokens": st.one_of(_ints, st.none(), st.booleans(), st.floats(0, 5), st.text(max_size=2)),
                  "stream": st.one_of(st.booleans(), st.none(), st.integers(0, 1), st.text(max_size=2)),
                  "stream_options": st.one_of(st.none(), st.integers(0, 1), st.lists(st.booleans(), max_size=1),
                                              st.fixed_dictionaries({}, optional={
                                                  "include_usage": st.one_of(st.booleans(), st.none(), st.integers(0, 1),
                                                                             st.text(max_size=1)),
                                                  "zz": _values})),
                  "cache_salt": _values})
    return st.tuples(base, st.dictionaries(_keys, _values, max_size=2)).map(
        lambda t: {**t[0], **t[1]} if t[1] and t[1].keys().isdisjoint({"model"}) else t[0])


_valid = st.fixed_dictionaries(
    {"model": st.text(min_size=1, max_size=5), "prompt": st.text(min_size=1, max_size=8)},
    optional={"max_tokens": st.one_of(st.integers(1, 3), st.none()), "stream": st.booleans(),
              "stream_options": st.one_of(st.none(), st.fixed_dictionaries({}, optional={
                  "include_usage": st.one_of(st.booleans(), st.none()), "x": _values})),
              "cache_salt": _values, "hint": _values})


def _schema(data: dict[str, Any]) -> dict[str, Any] | None:
    try:
        body = CompletionBody.model_validate(data).model_dump(exclude_none=True, exclude_unset=False)
    except ValidationError:
        return None
    if body.get("n") == 1:
        body.pop("n")
    return body


@settings(max_examples=600, deadline=None)
@given(st.one_of(_plain(), _valid))
def test_shortcut_equals_the_schema_or_declines(data: dict[str, Any]) -> None:
    data = json.loads(json.dumps(data))  # what the parser hands it: a decoded JSON object
    fast = plain_completion(data)
    if fast is None:
        return
    assert list(fast.items()) == list(_schema(data).items())  # type: ignore[union-attr]
    assert [type(v) for v in fast.values()] == [type(v) for v in _schema(data).values()]  # type: ignore[union-attr]


@pytest.mark.parametrize("data", [
    {"model": "m", "prompt": "hello"},
    {"model": "m", "prompt": "hello", "max_tokens": 1},
    {"model": "m", "prompt": "hello", "max_tokens": None, "stream": True},
    {"model": "m" * 256, "prompt": "é", "max_tokens": MAX_TOKENS_CEILING, "stream": False},
    {"model": "m", "prompt": "p", "max_tokens": 9, "stream": True, "stream_options": {"include_usage": True},
     "cache_salt": "s"},
    # S22-newcomer-4: stream_options only with stream true (the schema refuses it otherwise)
    {"model": "m", "prompt": "p", "stream": True, "stream_options": {"include_usage": None, "other": [1]},
     "hint": {"a": 1}},
])
def test_plain_bodies_take_the_shortcut(data: dict[str, Any]) -> None:
    assert plain_completion(data) == _schema(data)


@pytest.mark.parametrize("doc", [
    {"model": "sim-model", "prompt": "a b c", "max_tokens": 3, "stream": True},
    {"model": "sim-model", "prompt": "a b c", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True},
     "cache_salt": "tenant-salt"},
    {"model": "sim-model", "prompt": "a b c", "stream": True, "stream_options": {"include_usage": False}},
])
def test_parse_of_a_plain_body_does_not_call_pydantic_and_matches_it(monkeypatch: pytest.MonkeyPatch,
                                                                    doc: dict[str, Any]) -> None:
    raw = json.dumps(doc).encode()
    fast = parse_inference_request(raw, "completions")
    calls: list[int] = []
    real = request_mod.plain_completion
    monkeypatch.setattr(request_mod, "plain_completion", lambda data, *a: calls.append(1) or None)
    slow = parse_inference_request(raw, "completions")
    assert calls == [1]
    assert fast == slow and list(fast.body) == list(slow.body)
    monkeypatch.setattr(request_mod, "plain_completion", real)

    def refuse(*a: Any, **k: Any) -> Any:
        raise AssertionError("pydantic called for a plain body")

    monkeypatch.setattr(request_mod.CompletionBody, "model_validate", refuse)
    assert parse_inference_request(raw, "completions") == slow


@pytest.mark.parametrize("doc", [
    {"model": "m", "prompt": "", "max_tokens": 1},
    {"model": "", "prompt": "p"},
    {"model": "m", "prompt": "p", "max_tokens": 0},
    {"model": "m", "prompt": "p", "max_tokens": True},
    {"model": "m", "prompt": "p", "max_tokens": MAX_TOKENS_CEILING + 1},
    {"model": "m", "prompt": "p", "stream": 1},
    {"model": "m", "prompt": "p", "stream_options": {"include_usage": 1}},
    {"model": "m", "prompt": "p", "stream_options": []},
])
def test_refusals_are_unchanged(doc: dict[str, Any]) -> None:
    raw = json.dumps(doc).encode()
    with pytest.raises(request_mod.GatewayError) as err:
        parse_inference_request(raw, "completions")
    try:
        CompletionBody.model_validate(doc)
    except ValidationError as exc:
        msg, loc = request_mod.schema_error(exc)
    assert (err.value.status, err.value.code, err.value.message) == (400, "invalid_request", msg)
