"""What a tenant's prompt-token bucket admits before its prompt is tokenized (review R3-2).

A prompt-token bucket (:mod:`tenancy.ledger`, debt semantics) admits a prompt of ``n``
tokens when it holds ``min(n, burst)``. So a full bucket admits any prompt, and a bucket at
``level < burst`` admits exactly the prompts of at most ``floor(level)`` tokens. Admission
reads that figure first and then (gateway/admission.py):

* refuses 429 ``token_rate_limited`` a prompt whose UTF-8 size alone proves it holds more
  tokens than that (:meth:`~tenancy.tokenizer.Tokenizer.max_text_bytes`), tokenizing nothing;
* tokenizes any other prompt with ``limit = min(max_prompt_tokens, cap)`` (early stop after
  ``limit + 1`` tokens), so a refused prompt costs O(cap), not O(prompt), and an admitted
  prompt's count is exact.
"""

from __future__ import annotations

from typing import NamedTuple

from tenancy.registry import Tenant
from tenancy.tokenizer import Tokenizer

__all__ = ["PromptRoom", "min_tokens", "shared_room"]


class PromptRoom(NamedTuple):
    """A prompt-token bucket below its burst, read at one instant.

    ``cap``: the most prompt tokens (all sequences of a request) it admits now,
    ``max(0, floor(level))``; ``level`` (tokens, negative in debt), ``burst`` (tokens) and
    ``rate`` (tokens/s): the bucket's.
    """

    cap: int
    level: float
    burst: float
    rate: float

    def wait_s(self, at_least: int) -> float:
        """Seconds until the bucket admits a prompt known to hold at least ``at_least`` tokens."""
        need = min(float(max(1, at_least)), self.burst)
        return max(0.0, (need - self.level) / self.rate)


def min_tokens(tokenizer: Tokenizer, nbytes: int, texts: int = 1) -> int:
    """A lower bound on the tokens of ``texts`` texts of ``nbytes`` UTF-8 bytes in all: the
    least ``t`` with ``tokenizer.max_text_bytes(t + texts - 1) >= nbytes`` (binary search; the
    bound is monotone in ``t``; ``texts - 1`` extra tokens cover the bound's per-text constant,
    as :func:`tenancy.bounds.request_bounds` does for a chat request's second text)."""
    extra = max(0, texts - 1)
    if tokenizer.max_text_bytes(extra) >= nbytes:
        return 0
    lo, hi = 0, 1
    while tokenizer.max_text_bytes(hi + extra) < nbytes:
        lo, hi = hi, hi * 2
    while hi - lo > 1:  # max_text_bytes(lo + extra) < nbytes <= max_text_bytes(hi + extra)
        mid = (lo + hi) // 2
        if tokenizer.max_text_bytes(mid + extra) < nbytes:
            lo = mid
        else:
            hi = mid
    return hi


def shared_room(tenant: Tenant, level: float, rate: float, burst: float, elapsed_s: float) -> PromptRoom | None:
    """The :class:`PromptRoom` of a shared (Redis) prompt-token bucket read ``elapsed_s`` seconds ago
    at ``level`` tokens with its stored ``rate`` (tokens/s) and ``burst`` (tokens), as the admit
    script returns it (issue 16: the early check holds across instances).

    Refilled by ``elapsed_s`` at the stored rate and capped as the ledger's script does (at the
    stored burst, then at the tenant's burst when its limits changed), so the room is never
    below what the reservation will find unless other instances spent some since (then the
    reservation still refuses). ``None``: the tenant has no prompt-token rate, or the bucket is full.
    """
    pr = tenant.prompt_tokens_per_s
    if pr is None:
        return None
    pb = tenant.prompt_tokens_burst if tenant.prompt_tokens_burst is not None else max(1.0, pr)
    level = min(burst, level + max(0.0, elapsed_s) * rate)
    if rate != pr or burst != pb:
        level = min(level, pb)
    if level >= pb:
        return None
    return PromptRoom(max(0, int(level)), level, pb, pr)
