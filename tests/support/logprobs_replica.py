"""A fake replica whose plain ``logprobs`` answer is large (shared by the session 11 answer-cost tests).

``BigAnswerFake`` is the replica's state for :func:`tests.support.fake_replicas.serving`;
:func:`big_answer_fake` makes one whose ``big`` answer is a completion with 20 log-probabilities
per token (:func:`tests.security.test_s10_answer_cpu.logprobs_answer`, ~1.4 MB);
:func:`plain_or_big` is the plain-answer part of such a replica's completions handler.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.security.test_s10_answer_cpu import logprobs_answer
from tests.support.fake_replicas import PLAIN_ANSWER

__all__ = ["BigAnswerFake", "big_answer_fake", "plain_or_big"]


@dataclass
class BigAnswerFake:
    url: str = ""
    healthy: bool = True
    big: bytes = b""


def big_answer_fake() -> BigAnswerFake:
    """A fake whose ``big`` body is the logprobs answer, encoded once."""
    return BigAnswerFake(big=json.dumps(logprobs_answer()).encode())


def plain_or_big(fake: BigAnswerFake, body: dict[str, Any]) -> web.Response:
    """The big answer when the request asks for ``logprobs``, else the short plain answer."""
    if body.get("logprobs"):
        return web.Response(body=fake.big, content_type="application/json")
    return web.json_response(PLAIN_ANSWER)
