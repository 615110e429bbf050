"""Session 19, helper fixq (S19-R6): the tenant's per-request bounds now, checked again on the counts a request
admitted before a change kept (gateway/pep_recheck.py ``check_kept_bounds``, called by ``decide_again``), with a
fresh request's 400 codes. The end-to-end case (a reload lowering ``max_prompt_tokens`` while a request is queued)
is tests/gateway/test_s19_review_recheck_bounds.py."""
from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import GatewayError
from gateway.pep_recheck import check_kept_bounds
from gateway.request import InferenceRequest
from tenancy.bounds import RequestBounds

WIDE = RequestBounds(max_prompt_tokens=100, max_prompt_bytes=1000, max_messages=8, max_batch_prompts=4)


def completion(*sizes: int) -> InferenceRequest:
    """A queued completions request: its prompt text forgotten, its counts kept (as after ``queued_form``)."""
    req = InferenceRequest("completions", "m", False, 20, False, {}, "x", ("x",) * len(sizes), "", sizes)
    req.forget_prompt_text()
    return req


def chat() -> InferenceRequest:
    return InferenceRequest("chat", "m", False, 20, False, {}, "x", ("x",), "", (10,))


def code(bounds: RequestBounds, req: InferenceRequest, tokens: int, messages: Any = None) -> str | None:
    try:
        check_kept_bounds(bounds, req, tokens, messages, parsed=True)
        check_kept_bounds(bounds, req, tokens, messages, parsed=False)
    except GatewayError as err:
        assert err.status == 400
        return err.code
    return None


def test_within_the_bounds_nothing_is_refused() -> None:
    assert code(WIDE, completion(40), 10) is None
    assert code(WIDE, chat(), 10, [{"role": "user", "content": "hi"}]) is None


@pytest.mark.parametrize(("bounds", "req", "tokens", "expected"), [
    (RequestBounds(8, 1000, 8, 4), completion(40), 9, "context_length_exceeded"),
    (RequestBounds(9, 1000, 8, 4), completion(40), 9, None),  # at the bound: admitted, as a fresh request
    (RequestBounds(100, 30, 8, 4), completion(40), 9, "prompt_too_large"),
    (RequestBounds(100, 30, 8, 4), completion(10, 31), 9, "prompt_too_large"),  # any sequence's bytes
    (RequestBounds(100, 1000, 8, 2), completion(5, 5, 5), 9, "batch_too_large"),
    (RequestBounds(4, 1000, 8, 4), completion(5, 5), 9, "context_length_exceeded"),  # 9 > 4 x 2
])
def test_a_lowered_bound_refuses_with_a_fresh_requests_code(bounds: RequestBounds, req: InferenceRequest,
                                                           tokens: int, expected: str | None) -> None:
    assert code(bounds, req, tokens) == expected


def test_a_batch_whose_longest_count_is_not_known_is_checked_on_its_total() -> None:
    # session 20 (fixq-2): a batch's longest prompt is kept (req.longest_prompt_tokens, tests/gateway/
    # test_s20_fixreg_bounds.py); unknown, the total bounds every prompt: 8 tokens under a bound of 4 refused
    assert code(RequestBounds(4, 1000, 8, 4), completion(5, 5), 8) == "context_length_exceeded"
    assert code(RequestBounds(8, 1000, 8, 4), completion(5, 5), 8) is None


def test_chat_messages_are_counted_on_the_body_it_sends() -> None:
    two = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert code(RequestBounds(100, 1000, 1, 4), chat(), 3, two) == "too_many_messages"
    parts = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert code(RequestBounds(100, 1000, 1, 4), chat(), 3, parts) == "too_many_content_parts"
    assert code(RequestBounds(100, 1000, 2, 4), chat(), 3, parts) is None


def test_the_parse_bounds_come_before_the_prompt_bounds() -> None:
    # a fresh request is refused by the parse's bounds before its prompt is counted: the same order here
    low = RequestBounds(1, 1, 8, 1)
    assert code(low, completion(5, 5), 9) == "batch_too_large"
