"""Session 23, S23-review-2: the ``stream_options``-without-``stream`` refusal (S22-newcomer-4) names its field in
``param``, as OpenAI's does (it was a model validator, whose error has no location: ``param: null``)."""
from __future__ import annotations

import json

import pytest

from gateway.errors import GatewayError
from gateway.request import parse_inference_request

MSGS = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("endpoint, body", [
    ("chat", {"model": "m", "messages": MSGS, "stream_options": {"include_usage": True}}),
    ("chat", {"model": "m", "messages": MSGS, "stream": False, "stream_options": {}}),
    ("completions", {"model": "m", "prompt": "x", "stream_options": {"include_usage": False}}),
])
def test_refusal_names_stream_options(endpoint: str, body: dict) -> None:
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(json.dumps(body).encode(), endpoint)  # type: ignore[arg-type]
    assert (exc.value.status, exc.value.code, exc.value.param) == (400, "invalid_request", "stream_options")
    assert "only allowed when stream is true" in exc.value.message


def test_an_invalid_stream_is_named_first() -> None:
    body = {"model": "m", "prompt": "x", "stream": "yes", "stream_options": {}}
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(json.dumps(body).encode(), "completions")
    assert exc.value.param == "stream"


@pytest.mark.parametrize("stream_options", [None, {}, {"include_usage": True}])
def test_with_stream_true_accepted(stream_options: object) -> None:
    body = {"model": "m", "messages": MSGS, "stream": True, "stream_options": stream_options}
    req = parse_inference_request(json.dumps(body).encode(), "chat")
    assert req.stream and req.include_usage is (stream_options == {"include_usage": True})
