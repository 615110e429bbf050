"""Session 8 (issue 14): the word tokenizer's ``bytes.split()`` shortcut gives the pattern's tokens exactly."""
from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

import tenancy.tokenizer as tk
from tenancy.plain_words import SPLIT_BLANKS, WORD_BYTES, plain_words

_ALPHABET = st.sampled_from([chr(c) for c in range(128)])
_WORDY = st.sampled_from(list(WORD_BYTES.decode()) + list(SPLIT_BLANKS.decode()))


def _texts() -> st.SearchStrategy[str]:
    word = st.text(st.sampled_from(list(WORD_BYTES.decode())), min_size=1, max_size=70)
    blank = st.text(st.sampled_from(list(SPLIT_BLANKS.decode())), min_size=1, max_size=70)
    runs = st.lists(st.one_of(word, blank), max_size=12).map("".join)
    return st.one_of(st.text(_ALPHABET, max_size=300), st.text(_WORDY, max_size=300), runs)


@settings(max_examples=600, deadline=None)
@given(_texts())
@example(" " * 64 + "a")
@example(" " * 65 + "a")
@example("a" + " " * 64 + "b")
@example("a" + " " * 65 + "b")
@example("a " * 40 + " " * 63)
@example("x" * 64 + " y")
@example("x" * 65)
@example("a\x1cb")
@example("")
def test_plain_words_equals_the_ascii_pattern(text: str) -> None:
    raw = text.encode("ascii")
    got = plain_words(raw)
    if got is not None:  # accepted: exactly the pattern's tokens
        assert got == tk._ASCII_TOKEN_RE.findall(raw)
    # and encode, shortcut or not, equals the reference of the pattern alone, with and without a limit
    for limit in (None, 0, 3, 200):
        assert tk.WordTokenizer().encode(text, limit) == _reference(text, limit)


def _reference(text: str, limit: int | None) -> list[int]:
    """Every token of the str pattern, long ones cut into 64-character pieces, the first limit + 1."""
    out: list[str] = []
    for m in tk._TOKEN_RE.finditer(text):
        g = m.group()
        out.extend(g[i:i + tk.MAX_TOKEN_CHARS] for i in range(0, len(g), tk.MAX_TOKEN_CHARS))
    if limit is not None:
        del out[limit + 1:]
    return [tk.WordTokenizer.token_id(t) for t in out]


def test_plain_words_takes_the_benchmark_prompt_and_refuses_what_it_cannot_read() -> None:
    assert plain_words(b"w1x0 w1x1\n w1x2") == [b"w1x0", b"w1x1", b"w1x2"]
    assert plain_words(b"Hello, world") is None  # a symbol: the patterns
    assert plain_words(b"a\x1fb") is None  # a blank bytes.split() does not know
    assert plain_words(b"x" * 65) is None  # a word the pattern cuts into pieces
    assert plain_words(b"a" + b" " * 65 + b"b") is None  # a run that is a token
    assert plain_words(b"a" + b"  " * 40 + b"b") is None  # bound not provable: the patterns decide
