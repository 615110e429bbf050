"""What :mod:`tenancy.tokenizer` and :mod:`tenancy.hf_tokenizer` share (no import cycle between them)."""

from __future__ import annotations

__all__ = ["TokenizerError", "MIN_MESSAGE_BYTES"]

#: Every rendered chat message has at least this many UTF-8 bytes (``"<|user|>\n" + "\n"``).
MIN_MESSAGE_BYTES = 10


class TokenizerError(ValueError):
    """Raised when a tokenizer cannot be built or a prompt cannot be rendered."""
