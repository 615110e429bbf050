"""Session 9 (issue 14): the word tokenizer's ASCII prose shortcut gives the pattern's tokens exactly.

:func:`tenancy.plain_words.ascii_tokens` spaces out each distinct symbol byte and splits; when it
accepts a text its tokens must be the ASCII pattern's, and ``encode`` (shortcut or not) must equal
the str pattern's reference on any text: ASCII prose, arbitrary ASCII, Latin-1, other Unicode.
"""
from __future__ import annotations

import string

from hypothesis import example, given, settings
from hypothesis import strategies as st

import tenancy.tokenizer as tk
from tenancy.plain_words import MAX_SYMBOL_KINDS, SPLIT_BLANKS, WORD_BYTES, ascii_tokens, latin1_tokens, plain_words

_WORD = st.text(st.sampled_from(list(WORD_BYTES.decode())), min_size=1, max_size=70)
_BLANK = st.text(st.sampled_from(list(SPLIT_BLANKS.decode()) + ["\x1c", "\x1f"]), min_size=1, max_size=70)
_SYMBOL = st.sampled_from([chr(c) for c in range(128) if not chr(c).isalnum() and chr(c) not in "_ \t\n\r\x0b\x0c"])
_PUNCT = st.sampled_from(list(string.punctuation))


def _prose() -> st.SearchStrategy[str]:
    """Words with punctuation before/after, single spaces or newlines, now and then a long run."""
    word = st.tuples(st.text(_PUNCT, max_size=2), _WORD, st.text(_PUNCT, max_size=3)).map("".join)
    sep = st.sampled_from([" ", " ", " ", "\n", "  ", "\t", ". ", ", ", " " * 64, " " * 65, "\x1c"])
    return st.lists(st.tuples(word, sep).map("".join), max_size=40).map("".join)


def _latin1_prose() -> st.SearchStrategy[str]:
    """Accented words, Latin-1 symbols and blanks (NBSP, NEL, \\x1c: the patterns' cases) between them."""
    letters = st.sampled_from(list("abcdeéèêàçñöüßÀÉØøÿªº²µ_0"))
    word = st.tuples(st.text(st.sampled_from(list("«¿¡(\"'")), max_size=1), st.text(letters, min_size=1, max_size=70),
                     st.text(st.sampled_from(list(".,;:!?»)©°\x80\x9f")), max_size=2)).map("".join)
    sep = st.sampled_from([" ", " ", "\n", " \xa0", "\x85", "\t", " " * 64, " " * 65, "\x1c"])
    return st.lists(st.tuples(word, sep).map("".join), max_size=30).map("".join)


def _texts() -> st.SearchStrategy[str]:
    runs = st.lists(st.one_of(_WORD, _BLANK, st.text(_SYMBOL, min_size=1, max_size=4)), max_size=14).map("".join)
    return st.one_of(
        _prose(), runs, _latin1_prose(),
        st.text(st.sampled_from([chr(c) for c in range(128)]), max_size=300),
        st.text(max_size=200),  # any Unicode (the shortcut is not taken: the patterns decide)
        st.text(st.sampled_from([chr(c) for c in range(256)]), max_size=200),
    )


def _reference(text: str, limit: int | None) -> list[int]:
    """Every token of the str pattern, long ones cut into 64-character pieces, the first limit + 1."""
    out: list[str] = []
    for m in tk._TOKEN_RE.finditer(text):
        g = m.group()
        out.extend(g[i:i + tk.MAX_TOKEN_CHARS] for i in range(0, len(g), tk.MAX_TOKEN_CHARS))
    if limit is not None:
        del out[limit + 1:]
    return [tk.WordTokenizer.token_id(t) for t in out]


@settings(max_examples=1500, deadline=None)
@given(_texts())
@example("Hello, world! (It's 9:30.)")
@example("a," + " " * 63 + "b")
@example("a," + " " * 64 + "b")
@example("," + " " * 65 + "b")
@example("x" * 64 + ".")
@example("x" * 65 + ".")
@example(".x" * 40)
@example("a\x1c,b")
@example("<|user|>\nhi there\n")
@example("".join(chr(c) for c in range(33, 127)))
@example("\x00\x01 a\x7f")
@example("é" * 64 + ",")
@example("é" * 65 + ",")
@example("café," + " " * 64 + "b")
@example("café," + " " * 65 + "b")
@example("naïve\x85x")
def test_ascii_tokens_equals_the_patterns(text: str) -> None:
    if text.isascii():
        raw = text.encode("ascii")
        got = ascii_tokens(raw)
        if got is not None:  # accepted: exactly the ASCII pattern's tokens
            assert got == tk._ASCII_TOKEN_RE.findall(raw)
        if plain_words(raw) is not None:  # the s8 shortcut's texts are all still accepted
            assert got == plain_words(raw)
    l1 = latin1_tokens(text)
    if l1 is not None:  # accepted: the str pattern's tokens, as UTF-8
        assert l1 == [m.encode("utf-8") for m in tk._TOKEN_RE.findall(text)]
    for limit in (None, 0, 3, 200):
        assert tk.WordTokenizer().encode(text, limit) == _reference(text, limit)


def test_latin1_tokens_takes_accented_prose() -> None:
    assert latin1_tokens("Ça va, «très» bien") == [t.encode("utf-8") for t in ["Ça", "va", ",", "«", "très", "»", "bien"]]
    assert latin1_tokens("a\xa0b") is None  # NBSP: a blank bytes.split() does not know
    assert latin1_tokens("日本") is None  # not Latin-1


def test_ascii_tokens_takes_prose_and_refuses_what_it_cannot_read() -> None:
    assert ascii_tokens(b"Hi, you (there).") == [b"Hi", b",", b"you", b"(", b"there", b")", b"."]
    assert ascii_tokens(b"<|user|>\nhello\n") == [b"<", b"|", b"user", b"|", b">", b"hello"]
    assert ascii_tokens(b"a\x1c,b") is None  # a blank bytes.split() does not know
    assert ascii_tokens(b"x" * 65 + b".") is None  # a word the pattern cuts into pieces
    assert ascii_tokens(b"a," + b" " * 65 + b"b") is None  # a run that is a token
    many = bytes(range(33, 48))  # 15 symbol kinds: taken; 16 + 1: the patterns
    assert ascii_tokens(many) == [bytes((c,)) for c in many]
    assert len(bytes(range(33, 48)) + b":;") > MAX_SYMBOL_KINDS
    assert ascii_tokens(bytes(range(33, 48)) + b":;") is None
