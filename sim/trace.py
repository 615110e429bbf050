"""Mooncake trace loading and prompt building for the replica simulator.

Trace format (Mooncake FAST'25, ``conversation_trace.jsonl``; see
``/work/shared/traces/SOURCES.md``): one JSON object per line,
``{"timestamp": <ms since trace start>, "input_length": <tokens>,
"output_length": <tokens>, "hash_ids": [<int>, ...]}``, one hash id per
512-token prefix block; equal ids mean the same reusable KV blocks.

Scaling (shared constant, docs/architecture.md): each 512-token trace block
becomes :data:`SIM_TOKENS_PER_TRACE_BLOCK` = 32 simulator tokens, so one
simulator token stands for :data:`REAL_TOKENS_PER_SIM_TOKEN` = 16 real tokens.
The simulator states its prefill speed and KV capacity in real tokens and
converts them by that same factor. A partial last trace block of ``r`` real
tokens becomes ``max(1, ceil(r / 16))`` simulator tokens.

The words of a block are a deterministic function of its hash id only
(``b{id}w{j}``), each exactly one token under
:class:`tenancy.tokenizer.WordTokenizer`, so requests sharing trace blocks
share identical token prefixes, and with 16-token KV blocks every full trace
block is exactly two simulator KV blocks.

Conversations: Mooncake has no conversation id and block 0 is shared by every
request (a common system prompt), so the conversation of a request is
``hash_ids[1]`` (or ``hash_ids[0]`` for single-block requests).
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "TRACE_BLOCK_TOKENS",
    "SIM_TOKENS_PER_TRACE_BLOCK",
    "REAL_TOKENS_PER_SIM_TOKEN",
    "DEFAULT_TRACE_PATH",
    "TraceRequest",
    "TraceFormatError",
    "load_mooncake",
    "block_sim_tokens",
    "sim_prompt_tokens",
    "block_words",
    "build_prompt",
    "conversation_id",
    "assign_tenants",
]

TRACE_BLOCK_TOKENS = 512
"""Real tokens per Mooncake ``hash_ids`` block."""

SIM_TOKENS_PER_TRACE_BLOCK = 32
"""Simulator tokens per 512-token trace block (1 simulator token = 16 real tokens)."""

REAL_TOKENS_PER_SIM_TOKEN = TRACE_BLOCK_TOKENS // SIM_TOKENS_PER_TRACE_BLOCK

DEFAULT_TRACE_PATH = Path(__file__).resolve().parent.parent / "data" / "traces" / "conversation_trace.jsonl"


class TraceFormatError(ValueError):
    """Raised for a trace line that is not a valid Mooncake record (message names the line)."""


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One trace request.

    ``timestamp`` is seconds since trace start; ``input_length`` and
    ``output_length`` are real tokens; ``hash_ids`` has one id per 512-token
    block; ``index`` is the 0-based row number in the file.
    """

    index: int
    timestamp: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def _parse_line(lineno: int, line: str) -> TraceRequest:
    try:
        rec = json.loads(line)
        ts = rec["timestamp"]
        inp = rec["input_length"]
        out = rec["output_length"]
        ids = rec["hash_ids"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise TraceFormatError(f"line {lineno + 1}: not a Mooncake record: {exc}") from exc
    if not isinstance(ts, (int, float)) or ts < 0:
        raise TraceFormatError(f"line {lineno + 1}: timestamp must be a non-negative number (ms)")
    if not isinstance(inp, int) or inp <= 0 or not isinstance(out, int) or out < 0:
        raise TraceFormatError(f"line {lineno + 1}: input_length must be > 0 and output_length >= 0 (ints)")
    if not isinstance(ids, list) or not ids or not all(isinstance(h, int) and h >= 0 for h in ids):
        raise TraceFormatError(f"line {lineno + 1}: hash_ids must be a non-empty list of non-negative ints")
    if len(ids) != math.ceil(inp / TRACE_BLOCK_TOKENS):
        raise TraceFormatError(
            f"line {lineno + 1}: {len(ids)} hash_ids for input_length {inp} (expected ceil(input/512))"
        )
    return TraceRequest(lineno, ts / 1000.0, inp, out, tuple(ids))


def iter_mooncake(path: str | Path, limit: int | None = None) -> Iterator[TraceRequest]:
    """Yield :class:`TraceRequest` rows of a Mooncake JSONL file in file order.

    Blank lines are skipped (they do not count towards ``limit``). Raises
    :class:`TraceFormatError` on a malformed record and :class:`OSError` if
    the file cannot be read.
    """
    n = 0
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh):
            if limit is not None and n >= limit:
                return
            if not line.strip():
                continue
            yield _parse_line(lineno, line)
            n += 1


def load_mooncake(path: str | Path = DEFAULT_TRACE_PATH, limit: int | None = None) -> list[TraceRequest]:
    """Load the first ``limit`` rows (all if ``None``) of a Mooncake trace; timestamps in seconds."""
    return list(iter_mooncake(path, limit))


def block_sim_tokens(req: TraceRequest) -> list[int]:
    """Return the simulator-token count of each trace block of ``req``.

    Full blocks give :data:`SIM_TOKENS_PER_TRACE_BLOCK`; the last block of
    ``r`` real tokens gives ``max(1, ceil(r / 16))``.
    """
    n = len(req.hash_ids)
    last_real = req.input_length - TRACE_BLOCK_TOKENS * (n - 1)
    last = max(1, math.ceil(last_real / REAL_TOKENS_PER_SIM_TOKEN))
    return [SIM_TOKENS_PER_TRACE_BLOCK] * (n - 1) + [last]


def sim_prompt_tokens(req: TraceRequest) -> int:
    """Return the prompt length of ``req`` in simulator tokens."""
    return sum(block_sim_tokens(req))


def block_words(hash_id: int, count: int) -> list[str]:
    """Return the first ``count`` words of trace block ``hash_id`` (``b{id}w{j}``, one token each)."""
    return [f"b{hash_id}w{j}" for j in range(count)]


def build_prompt(req: TraceRequest) -> str:
    """Return the simulator prompt of ``req``: its blocks' words joined by single spaces.

    Its WordTokenizer token count equals :func:`sim_prompt_tokens`; requests
    sharing leading hash ids share an identical token prefix.
    """
    words: list[str] = []
    for hid, count in zip(req.hash_ids, block_sim_tokens(req)):
        words.extend(block_words(hid, count))
    return " ".join(words)


def conversation_id(req: TraceRequest) -> int:
    """Return the conversation of ``req``: ``hash_ids[1]``, or ``hash_ids[0]`` for a one-block request."""
    return req.hash_ids[1] if len(req.hash_ids) > 1 else req.hash_ids[0]


def assign_tenants(reqs: Sequence[TraceRequest], tenants: Sequence[str] = ("tenant-a",), seed: int = 0) -> list[str]:
    """Assign each request a tenant, constant per conversation, deterministic in ``seed``.

    Each conversation (see :func:`conversation_id`) draws its tenant uniformly
    from ``tenants`` with a generator seeded by ``(seed, conversation)``, so
    the result does not depend on the order or subset of requests. Returns a
    list parallel to ``reqs``. Raises :class:`ValueError` for an empty
    ``tenants``.
    """
    if not tenants:
        raise ValueError("need at least one tenant")
    tenants = list(tenants)
    if len(tenants) == 1:
        return [tenants[0]] * len(reqs)
    memo: dict[int, str] = {}
    out: list[str] = []
    for req in reqs:
        conv = conversation_id(req)
        t = memo.get(conv)
        if t is None:
            t = random.Random(f"{seed}:{conv}").choice(tenants)
            memo[conv] = t
        out.append(t)
    return out
