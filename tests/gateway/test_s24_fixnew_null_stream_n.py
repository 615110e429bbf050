"""``stream: null`` and ``n: null`` read as their defaults (false / 1), as OpenAI's API types them (S24-newcomer-5).

Before session 24 both answered 400 (``stream: Input should be a valid boolean``, ``n: Input should be a
valid integer``) on chat and completions. Now a null is the same request as the field left out, on the
pydantic path and on the shortcut (gateway/request_fast.py) alike: a differential property over both paths.
A null ``stream`` with ``stream_options`` is refused as ``stream: false`` is; other non-bool / non-int values
are refused as before.
"""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gateway.request as request_mod
from gateway.errors import GatewayError
from gateway.request import parse_inference_request

_CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
_COMPLETION = {"model": "m", "prompt": "hi"}
_ABSENT = object()


def _parse(doc: dict[str, Any], endpoint: str) -> Any:
    return parse_inference_request(json.dumps(doc).encode(), endpoint)


@pytest.mark.parametrize("endpoint,base", [("chat", _CHAT), ("completions", _COMPLETION)])
@pytest.mark.parametrize("nulls", [{"stream": None}, {"n": None}, {"stream": None, "n": None}])
def test_null_stream_and_n_are_the_defaults(endpoint: str, base: dict[str, Any], nulls: dict[str, Any]) -> None:
    req = _parse({**base, **nulls}, endpoint)  # before: GatewayError 400 invalid_request
    assert req == _parse(base, endpoint) == _parse({**base, "stream": False, "n": 1}, endpoint)
    assert req.stream is False and req.body["stream"] is False and "n" not in req.body


@pytest.mark.parametrize("endpoint,base", [("chat", _CHAT), ("completions", _COMPLETION)])
def test_null_stream_with_stream_options_is_refused_as_stream_false(endpoint: str, base: dict[str, Any]) -> None:
    errors = []
    for stream in (None, False):
        with pytest.raises(GatewayError) as err:
            _parse({**base, "stream": stream, "stream_options": {"include_usage": True}}, endpoint)
        errors.append((err.value.status, err.value.code, err.value.param, err.value.message))
    assert errors[0] == errors[1] and errors[0][:3] == (400, "invalid_request", "stream_options")


@pytest.mark.parametrize("endpoint,base", [("chat", _CHAT), ("completions", _COMPLETION)])
@pytest.mark.parametrize("field,value", [("stream", 0), ("stream", "false"), ("n", True), ("n", 2), ("n", "1")])
def test_other_values_are_still_refused(endpoint: str, base: dict[str, Any], field: str, value: Any) -> None:
    with pytest.raises(GatewayError) as err:
        _parse({**base, field: value}, endpoint)
    assert (err.value.status, err.value.code, err.value.param) == (400, "invalid_request", field)


def _outcome(raw: bytes, endpoint: str) -> Any:
    try:
        return parse_inference_request(raw, endpoint)
    except GatewayError as exc:
        return (exc.status, exc.code, exc.param, exc.message)


_stream = st.sampled_from([_ABSENT, None, True, False, 0, 1, "true"])
_n = st.sampled_from([_ABSENT, None, 1, 2, 0, True, 1.0])
_options = st.sampled_from([_ABSENT, None, {}, {"include_usage": True}, {"include_usage": None}])
_max_tokens = st.sampled_from([_ABSENT, None, 1, 7])


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["chat", "completions"]), _stream, _n, _options, _max_tokens)
def test_shortcut_and_schema_agree_on_null_stream_and_n(endpoint: str, stream: Any, n: Any, options: Any,
                                                        max_tokens: Any) -> None:
    doc = dict(_CHAT if endpoint == "chat" else _COMPLETION)
    for key, value in (("stream", stream), ("n", n), ("stream_options", options), ("max_tokens", max_tokens)):
        if value is not _ABSENT:
            doc[key] = value
    raw = json.dumps(doc).encode()
    both = _outcome(raw, endpoint)
    name = "plain_chat" if endpoint == "chat" else "plain_completion"
    real = getattr(request_mod, name)
    try:
        setattr(request_mod, name, lambda data, *a: None)  # the schema path alone
        schema_only = _outcome(raw, endpoint)
    finally:
        setattr(request_mod, name, real)
    assert both == schema_only
    if not isinstance(both, tuple):
        assert list(both.body) == list(schema_only.body)
        assert [type(v) for v in both.body.values()] == [type(v) for v in schema_only.body.values()]
    if stream is None and (n is _ABSENT or n is None or type(n) is int and n == 1) and options in (_ABSENT, None):
        assert not isinstance(both, tuple) and both.stream is False  # null = the default: accepted
