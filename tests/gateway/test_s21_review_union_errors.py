"""Session 21, review (S21-review-3): a refused union field names the branch the value was meant for.

``content`` (a string, a list of text parts or null), a completion's ``prompt`` and ``stop`` (a string or a list
of strings) are unions. pydantic reports one error per branch, the string branch first, and the 400 named the
first error only: a chat message whose ``content`` list held an image part (the commonest shape PrefixGate does
not serve) was answered ``messages.0.content.str: Input should be a valid string`` (param
``messages.0.content.str``), which tells the client that content must be a string, though text parts are served,
and names neither the part nor what is wrong with it. Now the error of the branch that got furthest into the
value is named (the first error stands where no branch got further: a number for ``content``).

Session 23 (S22-newcomer-5): the message names the branch (``messages.1.content.list[TextPart].1.type: ...``);
``param`` is the path in the client's body, without the branch tags (``messages.1.content.1.type``).
"""
from __future__ import annotations

import json

import pytest

from gateway.errors import GatewayError
from gateway.request import parse_inference_request


def _refusal(endpoint: str, body: dict) -> GatewayError:
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(json.dumps(body).encode(), endpoint)  # type: ignore[arg-type]
    assert exc.value.status == 400 and exc.value.code == "invalid_request"
    return exc.value


def _chat(content: object) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}, {"role": "user", "content": content}]}


@pytest.mark.parametrize("endpoint, body, param, words", [
    ("chat", _chat([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]),
     "messages.1.content.list[TextPart].1.type", "Input should be 'text'"),
    ("chat", _chat([{"type": "text", "text": 5}]), "messages.1.content.list[TextPart].0.text", "valid string"),
    ("chat", _chat([{"type": "text"}]), "messages.1.content.list[TextPart].0.text", "Field required"),
    ("chat", _chat(["a"]), "messages.1.content.list[TextPart].0", "valid dictionary"),
    ("completions", {"model": "m", "prompt": ["a", 5]}, "prompt.list[str].1", "valid string"),
    ("completions", {"model": "m", "prompt": "x", "stop": ["a", 1]}, "stop.list[str].1", "valid string"),
])
def test_the_branch_that_got_furthest_is_named(endpoint: str, body: dict, param: str, words: str) -> None:
    err = _refusal(endpoint, body)
    assert err.message.startswith(param + ": ") and words in err.message
    assert err.param == _client_path(param)


def _client_path(loc: str) -> str:
    return ".".join(p for p in loc.split(".") if p != "str" and "[" not in p)


@pytest.mark.parametrize("endpoint, body, param", [
    ("chat", _chat([{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}]),
     "messages.1.content.1.type"),
    ("completions", {"model": "m", "prompt": ["a", 5]}, "prompt.1"),
    ("completions", {"model": "m", "prompt": "x", "stop": ["a", 1]}, "stop.1"),
    ("chat", _chat(42), "messages.1.content"),
    ("completions", {"model": "m", "prompt": 7}, "prompt"),
])
def test_param_is_the_clients_path_without_branch_tags(endpoint: str, body: dict, param: str) -> None:
    """S22-newcomer-5: ``list[TextPart]``, ``list[str]``, ``str`` are in no client body."""
    assert _refusal(endpoint, body).param == param


@pytest.mark.parametrize("endpoint, body, param", [
    ("chat", _chat(42), "messages.1.content"),  # no branch got further: the first error, as before
    ("completions", {"model": "m", "prompt": 7}, "prompt"),
    ("completions", {"model": "m", "prompt": "x", "temperature": "hot", "seed": "s"}, "temperature"),  # first field
    ("chat", {"model": "m", "temperature": 9, "messages": [{"role": "nobody", "content": "x"}]}, "temperature"),
])
def test_otherwise_the_first_error_stands(endpoint: str, body: dict, param: str) -> None:
    assert _refusal(endpoint, body).param == param
