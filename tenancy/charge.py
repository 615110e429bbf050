"""What one request is charged when it ends (:func:`charge_for`; the table in :mod:`tenancy.ledger`'s
docstring). Pure; moved out of :mod:`tenancy.ledger` (session 11), which re-exports it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["charge_for"]


def charge_for(reserved_prompt: int, reserved_output: int, *, usage: Mapping[str, Any] | None,
               progress: str, relayed_output: int = 0) -> tuple[int, int, str]:
    """What one request is charged when it ends: ``(prompt, output, basis)`` in tokens.

    ``usage``: the replica's OpenAI ``usage`` object (or None);
    ``progress``: how far the request got — ``none`` (never reached a
    replica), ``refused`` (a replica answered an error status), ``streamed``
    (an SSE answer started), ``unknown`` (sent to a replica, outcome unknown:
    timeout, cancelled, a plain answer); ``relayed_output``: output tokens
    relayed to the client (the SSE scanner's estimate). The rules are the
    table of the module docstring; a usage object without an integer
    ``completion_tokens`` counts as no usage.
    """
    if usage:
        out = usage.get("completion_tokens")
        prompt = usage.get("prompt_tokens")
        if isinstance(out, int) and not isinstance(out, bool) and out >= 0:
            if not (isinstance(prompt, int) and not isinstance(prompt, bool) and prompt >= 0):
                prompt = reserved_prompt
            return prompt, out, "usage"
    if progress == "none":
        return 0, 0, "not_dispatched"
    if progress == "refused":
        return reserved_prompt, 0, "refused"
    if progress == "streamed":
        return reserved_prompt, max(0, relayed_output), "relayed"
    return reserved_prompt, reserved_output, "reservation"
