"""The plainest completions and chat bodies validated without pydantic (issue 14).

:func:`plain_completion` answers, for a decoded ``/v1/completions`` body whose schema fields are only
``model``, ``prompt`` (one string), ``max_tokens``, ``stream`` and ``stream_options`` with the plainest
valid values (other fields, unknown to the schema, are dropped unread as the schema drops them: a
``cache_salt``, routing hints), the dict that ``CompletionBody.model_validate(data).model_dump(
exclude_none=True)`` gives without ``n`` (which :func:`gateway.request.parse_inference_request` drops
when it is 1), keys in the same order. For anything else (another schema field, another type, a value
out of the schema's bounds) it answers None and the caller validates with pydantic as before, whose
error message stands: a body refused there is refused exactly as before. It never accepts what the
schema refuses (hypothesis: tests/gateway/test_s7_request_fast.py compares both on bodies in and
around that shape). :func:`plain_chat` does the same for a chat body whose messages are plain
``{role, content}`` objects with string (or no) content, or (session 20, S20-R3) content that is a list of
plain text parts ``{"type": "text", "text": str}`` (tests/gateway/test_s20_parts_fast.py).
"""

from __future__ import annotations

from typing import Any, get_args

from gateway.request_schema import MAX_TOKENS_CEILING, ChatBody, ChatMessage, CompletionBody

__all__ = ["plain_completion", "plain_chat", "text_parts", "FAST_KEYS", "FAST_CHAT_KEYS"]

#: the schema fields a completions body may hold to take the shortcut
FAST_KEYS = frozenset({"model", "prompt", "max_tokens", "stream", "stream_options"})
#: the same for a chat body
FAST_CHAT_KEYS = frozenset({"model", "messages", "max_tokens", "stream", "stream_options"})
_OTHER_FIELDS = frozenset(CompletionBody.model_fields) - FAST_KEYS  # any of these: pydantic
_OTHER_CHAT_FIELDS = frozenset(ChatBody.model_fields) - FAST_CHAT_KEYS
_OTHER_MESSAGE_FIELDS = frozenset(ChatMessage.model_fields) - {"role", "content"}
#: roles the shortcut takes: a ``tool`` message needs its ``tool_call_id`` (session 24, S23-newcomer-9): pydantic
_ROLES = frozenset(get_args(ChatMessage.model_fields["role"].annotation)) - {"tool"}
_MODEL_MAX_CHARS = 256  # model: min_length 1, max_length 256
assert FAST_KEYS <= set(CompletionBody.model_fields) and FAST_CHAT_KEYS <= set(ChatBody.model_fields)
assert _ROLES and all(type(r) is str for r in _ROLES)
assert not any(f.alias for m in (CompletionBody, ChatBody, ChatMessage) for f in m.model_fields.values())


def plain_completion(data: dict[str, Any], keys_checked: bool = False) -> dict[str, Any] | None:
    """``{"model", ["max_tokens",] "stream", ["stream_options",] "prompt"}`` as the schema validates
    ``data``, or None.

    ``data``: a decoded JSON object from orjson (``gateway.json_fast.loads_checked``'s ``fast``
    case: no lone surrogate, no non-finite number). ``model``: a string of 1-256 characters;
    ``prompt``: a non-empty string; ``max_tokens`` (optional, null allowed): an int (not a bool) in
    1..``MAX_TOKENS_CEILING``; ``stream`` (optional, null = false): a bool; ``stream_options`` (optional, null
    allowed; only with ``stream`` true): an object whose ``include_usage`` is absent, null or a bool (its other
    keys are dropped);
    no other schema field (``keys_checked``: the caller found every key of ``data`` in :data:`FAST_KEYS` or
    ``cache_salt``, so this is not tested again; session 23). Raises nothing.
    """
    if not keys_checked and not _OTHER_FIELDS.isdisjoint(data):
        return None
    prompt = data.get("prompt")
    if type(prompt) is not str or not prompt:
        return None
    body = _sampling(data)
    if body is not None:
        body["prompt"] = prompt
    return body


def plain_chat(data: dict[str, Any], keys_checked: bool = False) -> dict[str, Any] | None:
    """``{"model", ["max_tokens",] "stream", ["stream_options",] "messages"}`` as the schema validates
    ``data``, or None: as :func:`plain_completion`, with ``messages`` (a non-empty list) in place of
    ``prompt``, each an object whose schema fields are only ``role`` (one of the schema's roles but ``tool``) and
    ``content`` (a string or a list of text parts: see :func:`text_parts`; other keys dropped; null or absent
    content, which the schema refuses without ``tool_calls``, goes to pydantic); ``keys_checked`` as for
    :func:`plain_completion` (:data:`FAST_CHAT_KEYS`). Raises nothing.
    """
    if not keys_checked and not _OTHER_CHAT_FIELDS.isdisjoint(data):
        return None
    messages = data.get("messages")
    if type(messages) is not list or not messages:
        return None
    out: list[dict[str, Any]] = []
    for m in messages:
        if type(m) is not dict or not _OTHER_MESSAGE_FIELDS.isdisjoint(m):
            return None
        role, content = m.get("role"), m.get("content")
        if type(role) is not str or role not in _ROLES:
            return None
        if type(content) is str:  # null or absent content: only with tool_calls (pydantic refuses it, S22-newcomer-4)
            out.append({"role": role, "content": content})
        elif type(content) is list and (parts := text_parts(content)) is not None:
            out.append({"role": role, "content": parts})
        else:
            return None
    body = _sampling(data)
    if body is not None:
        body["messages"] = out
    return body


def text_parts(content: list[Any]) -> list[dict[str, str]] | None:
    """A message's list ``content`` as the schema dumps it (``[{"type": "text", "text": str}, ...]``, new
    dicts, that key order; an empty list stays empty, as ``list[TextPart]`` accepts it), or None unless
    every part is an object of exactly the two keys ``type`` (the string ``"text"``) and ``text`` (a
    string): extra keys (which the schema would drop), other part types, non-string text, nested lists
    go to pydantic, whose answer stands (OpenAI chat content parts; ``TextPart`` in
    gateway/request_schema.py). Raises nothing; O(parts).
    """
    out: list[dict[str, str]] = []
    append = out.append
    for part in content:
        if type(part) is not dict or len(part) != 2 or part.get("type") != "text":
            return None
        text = part.get("text")
        if type(text) is not str:
            return None
        append({"type": "text", "text": text})
    return out


def _sampling(data: dict[str, Any]) -> dict[str, Any] | None:
    """``model``, ``max_tokens``, ``stream`` and ``stream_options`` of ``data`` as the schema dumps them
    (that order, nulls left out), or None when one of them is not of the plainest valid form."""
    model = data.get("model")
    if type(model) is not str or not 0 < len(model) <= _MODEL_MAX_CHARS:
        return None
    max_tokens = data.get("max_tokens")
    stream = data.get("stream")
    if stream is None:  # absent or null: the default, as the schema reads it (S24-newcomer-5)
        stream = False
    elif type(stream) is not bool:
        return None
    if max_tokens is not None and (type(max_tokens) is not int or not 1 <= max_tokens <= MAX_TOKENS_CEILING):
        return None
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens} if max_tokens is not None else {"model": model}
    body["stream"] = stream
    options = data.get("stream_options")
    if options is not None:
        if type(options) is not dict or not stream:  # stream_options with stream false: pydantic (S22-newcomer-4)
            return None
        usage = options.get("include_usage")
        if usage is None:
            body["stream_options"] = {}
        elif type(usage) is bool:
            body["stream_options"] = {"include_usage": usage}
        else:
            return None
    return body
