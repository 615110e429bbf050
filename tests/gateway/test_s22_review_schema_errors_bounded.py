"""Session 22, review (S22-review-1): a refused list field holds ONE validation error, not one per item.

pydantic collects every error of a list by default, and :func:`gateway.request_schema.schema_error` reads
``exc.errors()``, which builds a dict per error. A 195 kB chat body whose ``stop`` (or ``tools``) list held
65,000 numbers (under ``limits.max_json_items``; ``stop`` is checked for its count only after its items' types)
made 65,001 errors: 160-515 ms of gateway CPU on the event loop for one refused request (live: globex's p99
went from ~27 to 546 ms, max 1,085 ms, while acme sent one every 1.5 s within its refused-CPU budget). Every
list of the schema now stops at its first bad item (pydantic's documented ``FailFast``): the error named is the
same (the first bad item), and the count of errors no longer grows with the list.
"""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from gateway.errors import GatewayError
from gateway.request import parse_inference_request
from gateway.request_schema import ChatBody, CompletionBody

N = 5_000


def _chat(**extra: object) -> dict:
    body: dict = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    body.update(extra)
    return body


@pytest.mark.parametrize("model, body", [
    (ChatBody, _chat(stop=[1] * N)),
    (ChatBody, _chat(tools=[1] * N)),
    (ChatBody, _chat(tools=[[]] * N)),
    (ChatBody, {"model": "m", "messages": [{"role": "user", "content": [1] * N}]}),
    (ChatBody, {"model": "m", "messages": [{"role": "assistant", "content": None, "tool_calls": [1] * N}]}),
    (ChatBody, {"model": "m", "messages": [{"role": "nobody", "content": "x"}] * N}),
    (CompletionBody, {"model": "m", "prompt": "x", "stop": [[]] * N}),
    (CompletionBody, {"model": "m", "prompt": [1] * N}),
])
def test_a_list_of_bad_items_holds_a_bounded_count_of_errors(model: type, body: dict) -> None:
    with pytest.raises(ValidationError) as exc:
        model.model_validate(body)
    assert exc.value.error_count() <= 8  # a few union branches, not one error per item (was > N)


@pytest.mark.parametrize("endpoint, body, param", [
    ("chat", _chat(stop=["a"] + [1] * N), "stop.1"),  # session 23: param without the union branch
    ("chat", _chat(tools=[{}] + [1] * N), "tools.1"),
    ("completions", {"model": "m", "prompt": ["a", "b", 3] + [4] * N}, "prompt.2"),
])
def test_the_first_bad_item_is_still_named(endpoint: str, body: dict, param: str) -> None:
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(json.dumps(body).encode(), endpoint, max_json_items=65_536)  # type: ignore[arg-type]
    assert exc.value.code == "invalid_request" and exc.value.param == param
