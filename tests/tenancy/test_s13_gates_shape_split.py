"""Session 13 (issue 14): the word tokenizer's ASCII / Latin-1 shortcut reads its bounds from one shape
``translate`` (tenancy/plain_words.py, ``_spaced_split``); it must answer exactly what the session-9
function answered (tokens, or None for "take the patterns") on every input, and the tokenizer must still
equal the str pattern (tests/tenancy/test_s9_ascii_tokens.py holds that part)."""
from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tenancy import plain_words as pw
from tests.tenancy.test_s9_ascii_tokens import _texts


def _split_bounded_s9(raw: bytes) -> list[bytes] | None:
    """The session-9 bounds (a second translate, a Python max over the tokens): the reference."""
    words = raw.split()
    if len(raw) - len(raw.translate(None, pw.SPLIT_BLANKS)) - len(words) > pw.MAX_TOKEN_CHARS - 2:
        return None
    if words and max(map(len, words)) > pw.MAX_TOKEN_CHARS:
        return None
    return words


def _spaced_split_s9(raw: bytes, words_and_blanks: bytes, other_blanks: frozenset[int]) -> list[bytes] | None:
    """The session-9 ``_spaced_split``, kept here as the reference."""
    symbols = raw.translate(None, words_and_blanks)
    if not symbols:
        return _split_bounded_s9(raw)
    kinds = set(symbols)
    if len(kinds) > pw.MAX_SYMBOL_KINDS or not other_blanks.isdisjoint(kinds):
        return None
    for kind in kinds:
        one = bytes((kind,))
        raw = raw.replace(one, b" " + one + b" ")
    return _split_bounded_s9(raw)


_EDGES = ["a" * 64, "a" * 65, " " * 63 + "a", " " * 64 + "a", "a" + " " * 64 + "b", "a" + " " * 65 + "b",
          "x, " * 30 + "a" * 64 + "!", "(" + "a" * 65 + ")", ". " * 40, "\x1c a", "a" + "." * 70, "é" * 65,
          "\xa0a", "a\x85b", " " * 62, " " * 63, ""]


@settings(max_examples=2000, deadline=None)
@given(_texts())
@example("w1x0 w1x1 w1x2")
def test_shape_bounds_equal_the_s9_bounds(text: str) -> None:
    for t in [text, *_EDGES]:
        raw = t.encode("latin-1", "ignore")
        if len(raw) == len(t):
            assert pw._spaced_split(raw, pw._L1_WORDS_AND_BLANKS, pw._L1_OTHER_BLANKS, pw._L1_SHAPE) == \
                _spaced_split_s9(raw, pw._L1_WORDS_AND_BLANKS, pw._L1_OTHER_BLANKS)
        if t.isascii():
            raw = t.encode("ascii")
            assert pw.ascii_tokens(raw) == _spaced_split_s9(raw, pw._WORDS_AND_BLANKS, pw._OTHER_BLANKS)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=300))
def test_shape_bounds_equal_on_any_bytes(raw: bytes) -> None:
    assert pw._spaced_split(raw, pw._L1_WORDS_AND_BLANKS, pw._L1_OTHER_BLANKS, pw._L1_SHAPE) == \
        _spaced_split_s9(raw, pw._L1_WORDS_AND_BLANKS, pw._L1_OTHER_BLANKS)
    low = bytes(b & 0x7F for b in raw)
    assert pw.ascii_tokens(low) == _spaced_split_s9(low, pw._WORDS_AND_BLANKS, pw._OTHER_BLANKS)
