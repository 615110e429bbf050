"""The word tokenizer's shortcut for an ASCII text of words and blanks only (session 8, issue 14).

:func:`plain_words` gives the tokens of such a text with ``bytes.split()`` in about a third of the
time of the tokenizer's ASCII pattern (``tenancy.tokenizer._ASCII_TOKEN_RE``), which it equals
exactly on the texts it accepts (hypothesis: tests/tenancy/test_s8_plain_words.py); for any other
text it answers None and the tokenizer scans with its patterns as before. It reads nothing but its
argument: no memo across calls (a shared one would be a timing side channel between tenants).

Session 9: :func:`ascii_tokens` extends it to ASCII prose with symbols (punctuation, brackets,
quotes): each distinct symbol byte is spaced out with one ``bytes.replace`` (a symbol is always a
token of its own), then the text is split as above. ~2x less than the pattern on 64-word prose
(hypothesis: tests/tenancy/test_s9_ascii_tokens.py, equal to the pattern on arbitrary ASCII);
:func:`latin1_tokens` does the same for a Latin-1 text (accented European prose) on its Latin-1 bytes.

Session 13: both read the bounds (blank runs, word lengths) from one ``translate`` of the text into its
shape (word byte ``a``, blank space, other ``!``) instead of a second ``translate`` and a Python-level
``max`` over the token lengths: ~30 % less on a 64-word prompt and on prose, same answers
(hypothesis against the session-9 function: tests/tenancy/test_s13_gates_shape_split.py).
"""

from __future__ import annotations

import re

__all__ = ["plain_words", "ascii_tokens", "latin1_tokens", "WORD_BYTES", "SPLIT_BLANKS", "MAX_SYMBOL_KINDS"]

#: Longest token in characters (= ``tenancy.tokenizer.MAX_TOKEN_CHARS``; checked there at import)
MAX_TOKEN_CHARS = 64
#: the ASCII word characters (the ASCII patterns' ``[A-Za-z0-9_]``)
WORD_BYTES = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_"
#: the blanks ``bytes.split()`` splits on (``bytes.isspace``): the ASCII patterns' blanks without ``\x1c-\x1f``
SPLIT_BLANKS = b" \t\n\r\x0b\x0c"
_WORDS_AND_BLANKS = WORD_BYTES + SPLIT_BLANKS
#: str's ``\s`` blanks that ``bytes.split()`` does not split on: a text holding one takes the patterns
_OTHER_BLANKS = frozenset(b"\x1c\x1d\x1e\x1f")
#: str's ``\w`` and ``\s`` restricted to Latin-1 (as ``tenancy.tokenizer``'s Latin-1 patterns), as byte values
_L1_WORD = bytes(c for c in range(256) if re.match(r"\w", chr(c)))
_L1_BLANK = bytes(c for c in range(256) if re.match(r"\s", chr(c)))
_L1_WORDS_AND_BLANKS = _L1_WORD + SPLIT_BLANKS
_L1_OTHER_BLANKS = frozenset(_L1_BLANK) - frozenset(SPLIT_BLANKS)
#: at most this many distinct symbol bytes are spaced out (one ``bytes.replace`` pass each); more: None
MAX_SYMBOL_KINDS = 16


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
    return _split_bounded(raw)


def _split_bounded(raw: bytes) -> list[bytes] | None:
    """``raw.split()`` when no word is longer than 64 and no blank run may be (else None)."""
    words = raw.split()
    if len(raw) - len(raw.translate(None, SPLIT_BLANKS)) - len(words) > MAX_TOKEN_CHARS - 2:
        return None
    if words and max(map(len, words)) > MAX_TOKEN_CHARS:
        return None
    return words


def ascii_tokens(raw: bytes) -> list[bytes] | None:
    """The tokens of ASCII ``raw`` (bytes of a str that ``isascii()``), or None: words, symbols and blanks.

    Accepted: what :func:`plain_words` accepts, and texts with symbols (ASCII bytes that are neither
    ``[A-Za-z0-9_]`` nor blanks) of at most :data:`MAX_SYMBOL_KINDS` distinct bytes, no
    ``\\x1c-\\x1f`` blank, no word longer than :data:`MAX_TOKEN_CHARS` and no blank run that may be
    longer. A symbol is a one-byte token of the pattern (``[^A-Za-z0-9_\\s]``) whatever its
    neighbours, so writing a blank on each side of it changes no token; the spaced text's
    ``split()`` is then the pattern's tokens, as for :func:`plain_words`. Blank runs are bounded the
    same way on the spaced text (``b'`` blanks, ``t`` tokens, ``b' - t <= 62``): each of its runs holds
    an original run, so none of those can be a 65-blank token. Work (session 13): one shape
    ``translate``, and with symbols one deleting ``translate`` and one ``replace`` per distinct symbol,
    one ``split``, two ``count`` and one substring test (all C; no Python loop over the tokens). Raises
    nothing.
    """
    return _spaced_split(raw, _WORDS_AND_BLANKS, _OTHER_BLANKS, _ASCII_SHAPE)


def latin1_tokens(text: str) -> list[bytes] | None:
    """The UTF-8 bytes of the tokens of ``text`` when it is Latin-1 only (U+0000..U+00FF), else None.

    :func:`ascii_tokens` on the text's Latin-1 bytes, with the word and blank sets of str's ``\\w`` and
    ``\\s`` restricted to Latin-1 (computed from them, as the tokenizer's Latin-1 patterns are); a text
    holding a blank ``bytes.split()`` does not know (``\\x1c-\\x1f``, NEL, NBSP) takes the patterns.
    One byte per character, so the word and run bounds are in characters. The tokens are turned into
    UTF-8 in one pass (none holds a line break). Raises nothing.
    """
    raw = text.encode("latin-1", "ignore")  # no exception to raise and catch for other texts (~1 µs)
    if len(raw) != len(text):  # another character (or a lone surrogate: the patterns raise for it)
        return None
    got = _spaced_split(raw, _L1_WORDS_AND_BLANKS, _L1_OTHER_BLANKS, _L1_SHAPE)
    if not got:
        return got
    return b"\n".join(got).decode("latin-1").encode("utf-8").split(b"\n")


def _spaced_split(raw: bytes, words_and_blanks: bytes, other_blanks: frozenset[int],
                  shape_table: bytes = b"") -> list[bytes] | None:
    """:func:`_split_bounded` of ``raw`` with each distinct symbol byte spaced out (module doc), or None.

    Session 13 (issue 14): the bounds are read from one ``translate`` of ``raw`` through
    ``shape_table`` (word byte -> ``a``, split blank -> space, any other byte -> ``!``) instead of a
    second ``translate`` and a Python-level ``max(map(len, ...))`` over the tokens: the spaced text's
    blanks are the shape's spaces plus two per symbol byte, and a token longer than 64 is a run of 65
    word bytes (a symbol token is one byte). Equal to the session-9 function on every input
    (hypothesis: tests/tenancy/test_s13_gates_shape_split.py)."""
    shape = raw.translate(shape_table or _shape_table(words_and_blanks))
    symbols = shape.count(b"!")
    if symbols:
        kinds = set(raw.translate(None, words_and_blanks))
        if len(kinds) > MAX_SYMBOL_KINDS or not other_blanks.isdisjoint(kinds):
            return None
        for kind in kinds:
            one = bytes((kind,))
            raw = raw.replace(one, b" " + one + b" ")
    words = raw.split()
    if shape.count(b" ") + 2 * symbols - len(words) > MAX_TOKEN_CHARS - 2 or _LONG_WORD in shape:
        return None
    return words


def _shape_table(words_and_blanks: bytes) -> bytes:
    """The ``bytes.translate`` table of :func:`_spaced_split`: a word byte (in ``words_and_blanks`` but
    not a split blank) -> ``a``, a :data:`SPLIT_BLANKS` byte -> space, any other byte -> ``!``."""
    blanks = frozenset(SPLIT_BLANKS)
    known = frozenset(words_and_blanks)
    return bytes(32 if c in blanks else 97 if c in known else 33 for c in range(256))


_LONG_WORD = b"a" * (MAX_TOKEN_CHARS + 1)
_ASCII_SHAPE = _shape_table(_WORDS_AND_BLANKS)
_L1_SHAPE = _shape_table(_L1_WORDS_AND_BLANKS)
