"""Session 4 (s4-small item 4): WordTokenizer.encode's fast path scans O(limit) characters, same output."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tenancy.tokenizer as tk
from tenancy.tokenizer import MAX_TOKEN_CHARS, WordTokenizer


def _slow(text: str, limit: int | None) -> list[int]:
    """Reference: every token of the whole text, pieces of long blank runs, cut to limit + 1."""
    out: list[str] = []
    for m in tk._TOKEN_RE.finditer(text):
        g = m.group()
        out.extend(g[i:i + MAX_TOKEN_CHARS] for i in range(0, len(g), MAX_TOKEN_CHARS))
    if limit is not None:
        del out[limit + 1:]
    return [WordTokenizer.token_id(t) for t in out]


class _Counted:
    def __init__(self, real: re.Pattern):
        self.real, self.scanned, self.found = real, 0, 0

    def findall(self, s):
        self.scanned += len(s)
        r = self.real.findall(s)
        self.found += len(r)
        return r

    def finditer(self, s):
        for m in self.real.finditer(s):
            self.found += 1
            self.scanned = max(self.scanned, m.end())
            yield m


@pytest.mark.parametrize("ch", ["!", "€", "a b "])
def test_scan_is_proportional_to_limit(monkeypatch, ch) -> None:
    counted = {name: _Counted(getattr(tk, name)) for name in ("_TOKEN_RE", "_ASCII_TOKEN_RE")}
    for name, c in counted.items():
        monkeypatch.setattr(tk, name, c)
    limit = 1000
    text = ch * (MAX_TOKEN_CHARS * (limit + 1) // len(ch))
    ids = WordTokenizer().encode(text, limit)
    assert len(ids) == limit + 1
    found = sum(c.found for c in counted.values())
    scanned = sum(c.scanned for c in counted.values())
    assert found <= 8 * (limit + 1), found  # before: 64 x (limit + 1) one-character tokens
    assert scanned <= 8 * (limit + 1) + 2 * MAX_TOKEN_CHARS * (limit + 1), scanned


_alphabet = st.sampled_from(["a", "Z", "9", "_", " ", "\n", "\t", "!", "€", "é", "\x1c", " " * 70, "w" * 70, "ß"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_alphabet, max_size=300).map("".join), st.one_of(st.none(), st.integers(0, 40)))
def test_output_identical_to_slow_path(text, limit) -> None:
    assert WordTokenizer().encode(text, limit) == _slow(text, limit)


@pytest.mark.parametrize("limit", [0, 1, 5, 63, 200])
def test_edges_around_the_slice(limit) -> None:
    tok = WordTokenizer()
    for text in ("!" * (8 * (limit + 1) + k) for k in (-1, 0, 1)):
        assert tok.encode(text, limit) == _slow(text, limit)
    long_words = ("w" * 64 + " ") * (limit + 1) + "!" * (64 * (limit + 1))
    assert tok.encode(long_words, limit) == _slow(long_words, limit)
    blanks = " " * (8 * (limit + 1) - 3) + "x" * 200
    assert tok.encode(blanks, limit) == _slow(blanks, limit)
    assert tok.encode(blanks + "€", limit) == _slow(blanks + "€", limit)
