"""Review R5b-4 (session 6): a text of Latin-1 characters only (NBSP, NEL, accented letters ...) is
scanned as its Latin-1 bytes with byte-set patterns, as an ASCII text is, instead of the str patterns
whose ``\\w``/``\\s`` test each character's Unicode category (NBSP/NEL blank runs cost ~1.5x ASCII
ones: ~9-10 ms at the 8192-token limit on the review host). The tokens must stay identical: the
oracle is the tokenizer's original pattern over the whole text, long blank runs cut into 64-character
pieces, cut to limit + 1 (as tests/tenancy/test_s5_blank_run_scan.py)."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenancy import tokenizer as tk
from tenancy.tokenizer import MAX_TOKEN_CHARS, WordTokenizer

_ORIGINAL = re.compile(r"\w{1,%d}|[^\w\s]|\s{%d,}" % (MAX_TOKEN_CHARS, MAX_TOKEN_CHARS + 1))


def _oracle(text: str, limit: int | None) -> list[int]:
    out: list[str] = []
    for g in _ORIGINAL.findall(text):
        out.extend(g[i:i + MAX_TOKEN_CHARS] for i in range(0, len(g), MAX_TOKEN_CHARS))
    return [WordTokenizer.token_id(t) for t in (out if limit is None else out[:limit + 1])]


# every Latin-1 class boundary: ASCII blanks and \x1c-\x1f, NEL, NBSP, word characters outside ASCII
# (ª ² µ º ¼ À ÿ), Latin-1 symbols (¡ § « ­ × ÷), controls (\x00 \x7f \x80 \x9f); plus ideographic space
# and other non-Latin-1 characters (the str patterns then), and \n inside long blank runs
_LATIN1 = [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\xa0", "a", "Z", "_", "7",
           "\xaa", "\xb2", "\xb5", "\xba", "\xbc", "\xc0", "\xe9", "\xff", "!", "\xa1", "\xa7", "\xab", "\xad",
           "\xd7", "\xf7", "\x00", "\x7f", "\x80", "\x9f"]
_OTHER = ["\u3000", "\u2028", "\u2009", "\u0301", "\u20ac", "\u200b", "\u0100"]
_RUN_LENGTHS = [1, 1, 2, 3, 5, 31, 63, 64, 65, 66, 127, 128, 129, 200]


def _texts(chars: list[str]) -> st.SearchStrategy[str]:
    return st.lists(st.tuples(st.sampled_from(chars), st.sampled_from(_RUN_LENGTHS)), max_size=60).map(
        lambda runs: "".join(c * n for c, n in runs))


@settings(max_examples=800, deadline=None)
@given(st.one_of(_texts(_LATIN1), _texts(_LATIN1 + _OTHER)), st.one_of(st.none(), st.integers(0, 60)))
def test_same_ids_as_the_original_pattern(text: str, limit: int | None) -> None:
    assert WordTokenizer().encode(text, limit) == _oracle(text, limit)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(max_codepoint=255), max_size=400), st.one_of(st.none(), st.integers(0, 40)))
def test_same_ids_on_any_latin1_text(text: str, limit: int | None) -> None:
    assert WordTokenizer().encode(text, limit) == _oracle(text, limit)


def test_latin1_byte_sets_are_str_classes_restricted_to_latin1() -> None:
    for c in range(256):
        ch = chr(c)
        raw = ch.encode("latin-1")
        assert bool(re.fullmatch(rb"(?:[%s])" % tk._L1_WORD, raw)) == bool(re.fullmatch(r"\w", ch)), hex(c)
        assert bool(re.fullmatch(rb"(?:[%s])" % tk._L1_BLANK, raw)) == bool(re.fullmatch(r"\s", ch)), hex(c)


@pytest.mark.parametrize("unit", ["\xa0" * 64 + "a", "\x85" * 64 + "\xe9", "\xe9" * 65 + "\xa0"], ids=["nbsp", "nel", "e-acute"])
def test_latin1_text_at_the_limit_skips_the_str_patterns(monkeypatch, unit: str) -> None:
    """A ~1 MiB NBSP/NEL prompt at the 8192-token limit never runs the str patterns (before: every slice did)."""
    used: list[str] = []

    class Spy:
        def __init__(self, name: str, pattern: re.Pattern[str]) -> None:
            self.name, self.pattern = name, pattern

        def findall(self, text: str) -> list[str]:
            used.append(self.name)
            return self.pattern.findall(text)

    monkeypatch.setattr(tk, "_TOKEN_RE", Spy("first", tk._TOKEN_RE))
    monkeypatch.setattr(tk, "_SPARSE_TOKEN_RE", Spy("sparse", tk._SPARSE_TOKEN_RE))
    text = unit * ((1 << 20) // len(unit.encode()))
    ids = WordTokenizer().encode(text, 8192)
    assert used == []
    monkeypatch.undo()
    assert ids == _oracle(text, 8192)
