"""S31-lead-1 (the open part of S31-newcomer31-5): the gateway's own refusals that quote a request's exact size
(``prompt has N bytes``, ``messages has N entries``, ``messages hold N messages, content parts ...``, ``prompt is a
batch of N prompts``, ``tools has N entries``, a tool's index in ``tools[i].function.name``) are rendered for that
answer alone (``client_text``), never kept in the process-wide cache of error bodies (gateway/errors.py
``_BODIES``), where one tenant's refusal made another tenant's identical one cheaper and kept the size in memory
(the S24-review-6 rule: request-derived text is not shared across tenants). The limit-only refusals (``request body
exceeds N bytes``: the tenant's limit, no request size) are still cached."""
from __future__ import annotations

from collections.abc import Callable

import orjson
import pytest

from gateway import errors
from gateway.admission_answers import check_prompt_bytes
from gateway.errors import GatewayError
from gateway.free_form import free_form_refusal
from gateway.request import parse_inference_request

#: sizes no limit or id in this file spells: the message's number is the request's own
ODD = 4_813


def _raised(call: Callable[[], object]) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        call()
    return info.value


def _chat(messages: list[dict[str, object]], **extra: object) -> bytes:
    return orjson.dumps({"model": "m", "messages": messages, **extra})


CASES: dict[str, Callable[[], GatewayError]] = {
    "prompt_too_large": lambda: _raised(lambda: check_prompt_bytes([ODD], 100)),
    "too_many_messages": lambda: _raised(lambda: parse_inference_request(
        _chat([{"role": "user", "content": "x"}] * 7), "chat", max_messages=3)),
    "too_many_content_parts": lambda: _raised(lambda: parse_inference_request(
        _chat([{"role": "user", "content": [{"type": "text", "text": "x"}] * 7}]), "chat", max_messages=3)),
    "batch_too_large": lambda: _raised(lambda: parse_inference_request(
        orjson.dumps({"model": "m", "prompt": ["x"] * 7}), "completions", max_batch_prompts=3)),
    "too_many_tools": lambda: free_form_refusal(
        {"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(7)]}, 3, None, 10),
}


@pytest.mark.parametrize("code", sorted(CASES))
def test_a_refusal_quoting_the_requests_size_is_not_kept_in_the_shared_body_cache(code: str) -> None:
    errors._BODIES.clear()
    err = CASES[code]()
    assert isinstance(err, GatewayError) and err.code == code and err.status == 400
    body = orjson.loads(err.response().body)["error"]
    assert body["code"] == code and body["message"] == err.message  # the client still reads the size
    assert not any(key[0] == code for key in errors._BODIES)  # nothing of it kept process-wide


def test_the_size_in_the_message_is_the_requests_own() -> None:
    err = _raised(lambda: check_prompt_bytes([ODD], 100))
    assert str(ODD) in err.message and err.client_text


def test_a_limit_only_refusal_is_still_cached() -> None:
    errors._BODIES.clear()
    err = GatewayError(413, "body_too_large", "request body exceeds 100 bytes")
    again = GatewayError(413, "body_too_large", "request body exceeds 100 bytes")
    first, second = err.response().body, again.response().body
    assert first == second and any(key[0] == "body_too_large" for key in errors._BODIES)
