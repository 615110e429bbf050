"""The word tokenizer's shortcut for an ASCII text of words and blanks only (session 8, issue 14).

:func:`plain_words` gives the tokens of such a text with ``bytes.split()`` in about a third of the
time of the tokenizer's ASCII pattern (``tenancy.tokenizer._ASCII_TOKEN_RE``), which it equals
exactly on the texts it accepts (hypothesis: tests/tenancy/test_s8_plain_words.py); for any other
text it answers None and the tokenizer scans with its patterns as before. It reads nothing but its
argument: no memo across calls (a shared one would be a timing side channel between tenants).
"""

from __future__ import annotations

__all__ = ["plain_words", "WORD_BYTES", "SPLIT_BLANKS"]

#: Longest token in characters (= ``tenancy.tokenizer.MAX_TOKEN_CHARS``; checked there at import)
MAX_TOKEN_CHARS = 64
#: the ASCII word characters (the ASCII patterns' ``[A-Za-z0-9_]``)
WORD_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_"
#: the blanks ``bytes.split()`` splits on (``bytes.isspace``): the ASCII patterns' blanks without ``\x1c-\x1f``
SPLIT_BLANKS = b" \t\n\r\x0b\x0c"
_WORDS_AND_BLANKS = WORD_BYTES + SPLIT_BLANKS


def plain_words(raw: bytes) -> list[bytes] | None:
    """The tokens of ASCII ``raw`` (bytes of a str that ``isascii()``), or None.

    Accepted: ``raw`` holds only word characters and ``bytes.split()`` blanks, no word longer than
    :data:`MAX_TOKEN_CHARS` and no blank run that may be longer than that. Then every word is one
    ``[A-Za-z0-9_]{1,64}`` match and every blank run a free separator (the pattern's long-run
    alternative needs 65 blanks), so the tokens are ``raw.split()``. None for a symbol, a
    ``\\x1c-\\x1f`` blank, a longer word or a run that may be longer. Raises nothing.

    Blank runs are bounded without finding them: with ``b`` blanks and ``w`` words, the ``w - 1``
    runs between words hold at least one blank each, so when ``b - w <= 62`` an inner run holds at
    most ``b - (w - 2) <= 64`` blanks and a leading or trailing one at most 63 (``w = 0``: ``b <= 62``).
    """
    if raw.translate(None, _WORDS_AND_BLANKS):  # a symbol or a \x1c-\x1f blank
        return None
    words = raw.split()
    if len(raw) - len(raw.translate(None, SPLIT_BLANKS)) - len(words) > MAX_TOKEN_CHARS - 2:
        return None
    if words and max(map(len, words)) > MAX_TOKEN_CHARS:
        return None
    return words
