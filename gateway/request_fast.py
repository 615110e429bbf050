"""The plainest completions body validated without pydantic (issue 14).

:func:`plain_completion` answers, for a decoded ``/v1/completions`` body holding only ``model``,
``prompt`` (one string), ``max_tokens`` and ``stream`` with the plainest valid values, the dict that
``CompletionBody.model_validate(data).model_dump(exclude_none=True)`` gives without ``n`` (which
:func:`gateway.request.parse_inference_request` drops when it is 1), keys in the same order. For
anything else (another field, another type, a value out of the schema's bounds) it answers None
and the caller validates with pydantic as before, whose error message stands: a body refused
there is refused exactly as before. It never accepts what the schema refuses
(hypothesis: tests/gateway/test_s7_request_fast.py compares both on bodies in and around that shape).
"""

from __future__ import annotations

from typing import Any

from gateway.request_schema import MAX_TOKENS_CEILING, CompletionBody

__all__ = ["plain_completion", "FAST_KEYS"]

#: the fields a body may hold to take the shortcut
FAST_KEYS = frozenset({"model", "prompt", "max_tokens", "stream"})
_MODEL_MAX_CHARS = 256  # CompletionBody.model: min_length 1, max_length 256
assert set(CompletionBody.model_fields) >= FAST_KEYS


def plain_completion(data: dict[str, Any]) -> dict[str, Any] | None:
    """``{"model", ["max_tokens",] "stream", "prompt"}`` as the schema validates ``data``, or None.

    ``data``: a decoded JSON object from orjson (``gateway.json_fast.loads_checked``'s ``fast``
    case: no lone surrogate, no non-finite number). ``model``: a string of 1-256 characters;
    ``prompt``: a non-empty string; ``max_tokens`` (optional, null allowed): an int (not a bool) in
    1..``MAX_TOKENS_CEILING``; ``stream`` (optional): a bool. Raises nothing.
    """
    if not data.keys() <= FAST_KEYS:
        return None
    model = data.get("model")
    prompt = data.get("prompt")
    if type(model) is not str or not 0 < len(model) <= _MODEL_MAX_CHARS or type(prompt) is not str or not prompt:
        return None
    max_tokens = data.get("max_tokens")
    stream = data.get("stream", False)
    if type(stream) is not bool:
        return None
    if max_tokens is None:
        return {"model": model, "stream": stream, "prompt": prompt}
    if type(max_tokens) is not int or not 1 <= max_tokens <= MAX_TOKENS_CEILING:
        return None
    return {"model": model, "max_tokens": max_tokens, "stream": stream, "prompt": prompt}
