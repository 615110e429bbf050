"""Per-request cost bounds of a tenant, checked before any costly step (issue 12).

A request's cost grows with what it asks the gateway to parse and tokenize
and with how many sequences it makes a replica run. The bounds, cheapest
first (docs/tenancy.md, "Request bounds")::

    max_batch_prompts  elements of a list ``prompt`` (each one is a sequence)
    max_messages       chat messages                   ┐ counted on the parsed JSON,
                                                       ┘ before schema validation
    max_prompt_bytes   UTF-8 bytes that become prompt tokens (per sequence),
                       plus the ``stop`` sequences (with the first sequence)
    max_prompt_tokens  tokens per sequence; tokenizing stops after limit + 1
    max_free_values    JSON values of a chat body's forwarded free-form fields (tools, tool_choice,
                       response_format, tool_calls), counted on the parsed JSON before schema validation

Defaults never refuse what the token limit allows: they are derived from
``max_prompt_tokens`` through the tokenizer's own bounds
(:meth:`tenancy.tokenizer.Tokenizer.max_text_bytes`, ``max_messages``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tenancy.registry import Tenant
from tenancy.tokenizer import Tokenizer

__all__ = ["RequestBounds", "request_bounds", "chat_units", "DEFAULT_MAX_BATCH_PROMPTS",
           "MAX_STOP_SEQUENCES", "MAX_STOP_CHARS", "STOP_BYTES_ALLOWANCE"]

#: Elements of a list ``prompt`` allowed when the tenant sets nothing (and its concurrency allows).
DEFAULT_MAX_BATCH_PROMPTS = 16

#: ``stop`` sequences a request may give (OpenAI's limit) and characters per sequence (R3-8).
MAX_STOP_SEQUENCES = 4
MAX_STOP_CHARS = 256
#: UTF-8 bytes the ``stop`` sequences can add to a request's prompt bytes (4 bytes per character at most);
#: the derived ``max_prompt_bytes`` adds it, so a default bound never refuses what the token limit allows.
STOP_BYTES_ALLOWANCE = MAX_STOP_SEQUENCES * MAX_STOP_CHARS * 4


@dataclass(frozen=True, slots=True)
class RequestBounds:
    """The effective per-request bounds of one tenant.

    ``max_prompt_tokens`` / ``max_prompt_bytes`` apply to each sequence
    (``None``: unbounded but for the body size cap); ``max_messages`` and
    ``max_batch_prompts`` always hold a number. ``max_free_values``: JSON values and keys a chat request's
    forwarded free-form fields may hold (``None``: unbounded but for ``limits.max_json_items``; S22-review-4).
    """

    max_prompt_tokens: int | None
    max_prompt_bytes: int | None
    max_messages: int
    max_batch_prompts: int
    max_free_values: int | None = None


def request_bounds(tenant: Tenant, tokenizer: Tokenizer, *, max_messages_ceiling: int,
                   default_max_prompt_tokens: int | None = None) -> RequestBounds:
    """Compute ``tenant``'s effective bounds under ``tokenizer``.

    * ``max_prompt_tokens``: the tenant's value, else ``default_max_prompt_tokens``
      (``limits.max_prompt_tokens``, s4: so no tenant is bounded only by the body size).

    * ``max_prompt_bytes``: the tenant's value, else
      ``tokenizer.max_text_bytes(max_prompt_tokens + 1)`` (the extra token
      covers the second text a chat request counts: its tools and other
      token-bearing fields) + :data:`STOP_BYTES_ALLOWANCE` (the ``stop``
      sequences are counted in the bytes, not in the tokens), else ``None``.
    * ``max_messages``: the tenant's value, else
      ``tokenizer.max_messages(max_prompt_tokens)``; never above the gateway
      ceiling ``max_messages_ceiling`` (``limits.max_messages``).
    * ``max_batch_prompts``: the tenant's value, else
      min(:data:`DEFAULT_MAX_BATCH_PROMPTS`, ``max_concurrency``).
    * ``max_free_values`` (session 22, S22-review-4): ``max_prompt_bytes`` (each JSON value or key of the
      free-form fields renders at least one byte of the first sequence's prompt bytes), lowered to
      ``tokenizer.max_json_values(max_prompt_tokens)`` when the tokenizer has that method (the ``word``
      tokenizer: each renders at least one token, counted in the first sequence's tokens); ``None`` when
      both are ``None``. A body over it would be refused ``prompt_too_large`` or ``context_length_exceeded``
      later, after its validation and rendering; it is refused before them instead.
    """
    tokens = tenant.max_prompt_tokens if tenant.max_prompt_tokens is not None else default_max_prompt_tokens
    pbytes = tenant.max_prompt_bytes
    if pbytes is None and tokens is not None:
        pbytes = tokenizer.max_text_bytes(tokens + 1) + STOP_BYTES_ALLOWANCE
    messages = tenant.max_messages
    if messages is None:
        messages = tokenizer.max_messages(tokens) if tokens is not None else max_messages_ceiling
    free = pbytes
    per_value = getattr(tokenizer, "max_json_values", None)  # optional (tenancy.tokenizer.WordTokenizer)
    if tokens is not None and per_value is not None:
        free = per_value(tokens) if free is None else min(free, per_value(tokens))
    batch = tenant.max_batch_prompts
    if batch is None:
        batch = DEFAULT_MAX_BATCH_PROMPTS
        if tenant.max_concurrency is not None:
            batch = min(batch, tenant.max_concurrency)
    return RequestBounds(
        max_prompt_tokens=tokens,
        max_prompt_bytes=pbytes,
        max_messages=max(1, min(messages, max_messages_ceiling)),
        max_batch_prompts=max(1, batch),
        max_free_values=free,
    )


def chat_units(messages: list[Any]) -> int:
    """What chat ``messages`` (decoded JSON, before schema validation) count against ``max_messages``.

    Each message counts once per part of a list ``content`` (a string: once; R4-1) plus once per
    entry of a list ``tool_calls`` (s5, review R4b-2: 5,000 tool calls in one message were read and
    validated uncounted), and at least once; anything that is not an object counts once. Every tool
    call renders as a JSON object of dozens of prompt tokens, so the derived bound (5 tokens a
    message) refuses no tool calls that the token limit admits.
    """
    units = 0
    for m in messages:
        c, calls = (m.get("content"), m.get("tool_calls")) if isinstance(m, dict) else (None, None)
        n = (len(c) if isinstance(c, list) else isinstance(c, str)) + (len(calls) if isinstance(calls, list) else 0)
        units += max(1, n)
    return units
