"""A fake replica whose plain ``logprobs`` answer is large (shared by the session 10 and 11 answer-cost tests).

:func:`logprobs_answer` is a vLLM-shaped completion with ``ALTERNATIVES`` log-probabilities per token
(``TOKENS`` tokens: ~1.4 MB encoded, :func:`big_answer_body`). ``BigAnswerFake`` is the replica's state
for :func:`tests.support.fake_replicas.serving`; :func:`big_answer_fake` makes one whose ``big`` answer
is that body; :func:`plain_or_big` is the plain-answer part of such a replica's completions handler and
:func:`plain_app` a replica that answers nothing else.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.support.fake_replicas import PLAIN_ANSWER, base_app

__all__ = ["ALTERNATIVES", "TOKENS", "BigAnswerFake", "big_answer_body", "big_answer_fake", "logprobs_answer",
           "plain_app", "plain_or_big"]

TOKENS = 2048
ALTERNATIVES = 20


def logprobs_answer(tokens: int = TOKENS, alternatives: int = ALTERNATIVES) -> dict[str, Any]:
    """A vLLM-shaped completion answer with ``alternatives`` log-probabilities per token."""
    top = [{f"tok{t}_{a}": -1.5 - a / 7 for a in range(alternatives)} for t in range(tokens)]
    return {"id": "c", "object": "text_completion", "created": 0, "model": "sim-model",
            "choices": [{"index": 0, "text": " x" * tokens, "finish_reason": "length",
                         "logprobs": {"tokens": [f"tok{t}" for t in range(tokens)],
                                      "token_logprobs": [-0.5] * tokens, "text_offset": list(range(tokens)),
                                      "top_logprobs": top}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": tokens + 3}}


@functools.cache
def big_answer_body() -> bytes:
    """:func:`logprobs_answer` encoded as JSON (once per test process)."""
    return json.dumps(logprobs_answer()).encode()


@dataclass
class BigAnswerFake:
    url: str = ""
    healthy: bool = True
    big: bytes = b""


def big_answer_fake() -> BigAnswerFake:
    """A fake whose ``big`` body is the logprobs answer (:func:`big_answer_body`)."""
    return BigAnswerFake(big=big_answer_body())


def plain_or_big(fake: BigAnswerFake, body: dict[str, Any]) -> web.Response:
    """The big answer when the request asks for ``logprobs``, else the short plain answer."""
    if body.get("logprobs"):
        return web.Response(body=fake.big, content_type="application/json")
    return web.json_response(PLAIN_ANSWER)


def plain_app(fake: BigAnswerFake) -> web.Application:
    """A fake replica that answers every completion with :func:`plain_or_big`."""
    async def completions(request: web.Request) -> web.StreamResponse:
        return plain_or_big(fake, await request.json())
    return base_app(fake, completions)
