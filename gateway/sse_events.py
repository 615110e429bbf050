"""The pure per-event facts of a streamed answer that :class:`gateway.sse.SseScanner` reads, and the
gateway's own error event (split from :mod:`gateway.sse`, session 28, to keep modules small).

OpenAI's streaming shapes: a completions choice carries ``text``; a chat choice a ``delta`` with
``content``, ``reasoning_content`` or ``tool_calls``; the last delta event of a choice sets its
``finish_reason``.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ends_choice", "error_event", "has_output"]


def ends_choice(choices: list[Any]) -> bool:
    """Whether a data event of one choice sets its ``finish_reason`` (the choice's last delta event)."""
    return len(choices) == 1 and type(choices[0]) is dict and choices[0].get("finish_reason") is not None


def has_output(choice: Any) -> bool:
    """True when a streamed choice carries generated output (text, content, reasoning, tool calls)."""
    if not isinstance(choice, dict):
        return False
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    if isinstance(delta, dict):
        return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))
    return False


def error_event(message: str, code: str, err_type: str = "server_error") -> bytes:
    """Return an SSE ``data:`` event carrying an OpenAI-style error object."""
    body = json.dumps({"error": {"message": message, "type": err_type, "code": code, "param": None}})
    return b"data: " + body.encode() + b"\n\n"
