"""Session 8 (issue 14): a plain completions body's request is built without the general path's steps,
and equals what the general path (pydantic, prompt_text, byte sizes) gives, field for field."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gateway.request as request_mod
from gateway.request import parse_inference_request

_prompts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=80)


@settings(max_examples=300, deadline=None)
@given(prompt=_prompts, max_tokens=st.one_of(st.none(), st.integers(1, 4096)), stream=st.booleans())
def test_plain_completion_request_equals_the_general_path(prompt: str, max_tokens: int | None, stream: bool) -> None:
    doc: dict[str, Any] = {"model": "m", "prompt": prompt, "stream": stream}
    if max_tokens is not None:
        doc["max_tokens"] = max_tokens
    raw = json.dumps(doc, ensure_ascii=bool(len(prompt) % 2)).encode()
    fast = parse_inference_request(raw, "completions")
    real = request_mod.plain_completion
    request_mod.plain_completion = lambda data, *a: None
    try:
        slow = parse_inference_request(raw, "completions")
    finally:
        request_mod.plain_completion = real
    assert fast == slow and list(fast.body) == list(slow.body)
    assert fast.prompt_bytes == (len(prompt.encode("utf-8")),) and fast.sequences == 1


def test_a_prompt_with_a_lone_surrogate_is_still_refused() -> None:
    raw = b'{"model": "m", "prompt": "a\\ud800b"}'
    with pytest.raises(request_mod.GatewayError) as exc:
        parse_inference_request(raw, "completions")
    assert exc.value.status == 400
