"""Review R4b-1 (session 5): past its first slice a long text is read in slices with a pattern that
takes a free blank run (<= 64) in one step, not match by match with a try at every blank. The tokens
must stay identical: the oracle is the tokenizer's original pattern (session 3, before any R4b-1
change), read over the whole text, long blank runs cut into 64-character pieces, cut to limit + 1."""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenancy import tokenizer as tk
from tenancy.tokenizer import FAST_SCAN_CHARS_PER_TOKEN, MAX_TOKEN_CHARS, WordTokenizer

_ORIGINAL = re.compile(r"\w{1,%d}|[^\w\s]|\s{%d,}" % (MAX_TOKEN_CHARS, MAX_TOKEN_CHARS + 1))
_ORIGINAL_BYTES = re.compile(rb"[A-Za-z0-9_]{1,%d}|[^A-Za-z0-9_\s\x1c-\x1f]|[\s\x1c-\x1f]{%d,}"
                             % (MAX_TOKEN_CHARS, MAX_TOKEN_CHARS + 1))


def _oracle_tokens(text: str, limit: int | None) -> list[str]:
    out: list[str] = []
    for g in _ORIGINAL.findall(text):
        out.extend(g[i:i + MAX_TOKEN_CHARS] for i in range(0, len(g), MAX_TOKEN_CHARS))
    return out if limit is None else out[:limit + 1]


def _oracle(text: str, limit: int | None) -> list[int]:
    return [WordTokenizer.token_id(t) for t in _oracle_tokens(text, limit)]


# blanks of every kind \s knows (ASCII, the \x1c-\x1f separators str counts as blanks, NBSP, ideographic,
# line separator, NEL), word characters (ASCII, accented, combining mark), symbols (ASCII, euro, ZWSP)
_CHARS = [" ", "\t", "\n", "\r", "\x0b", "\x1c", "\x1f", "\u00a0", "\u3000", "\u2028", "\u0085",
          "a", "Z", "_", "7", "é", "\u0301", "!", "€", "\u200b"]
_RUN_LENGTHS = [1, 1, 2, 3, 4, 5, 31, 63, 64, 65, 66, 127, 128, 129, 130, 200, 300]
_TEXTS = st.lists(st.tuples(st.sampled_from(_CHARS), st.sampled_from(_RUN_LENGTHS)), max_size=60).map(
    lambda runs: "".join(c * n for c, n in runs))
_ASCII_TEXTS = st.lists(st.tuples(st.sampled_from([c for c in _CHARS if c.isascii()]),
                                  st.sampled_from(_RUN_LENGTHS)), max_size=60).map(
    lambda runs: "".join(c * n for c, n in runs))


@settings(max_examples=600, deadline=None)
@given(st.one_of(_TEXTS, _ASCII_TEXTS), st.one_of(st.none(), st.integers(0, 60)))
def test_same_ids_as_the_original_pattern(text: str, limit: int | None) -> None:
    # limits this small make most of these texts longer than the first slice (4 x (limit + 1)
    # characters) and many longer than the read bound (128 x (limit + 2) + 1): every path and cut
    assert WordTokenizer().encode(text, limit) == _oracle(text, limit)


@settings(max_examples=600, deadline=None)
@given(st.one_of(_TEXTS, _ASCII_TEXTS))
def test_the_sparse_pattern_finds_the_original_tokens(text: str) -> None:
    assert tk._SPARSE_TOKEN_RE.findall(text) == _ORIGINAL.findall(text)
    if text.isascii():
        raw = text.encode("ascii")
        assert tk._ASCII_SPARSE_TOKEN_RE.findall(raw) == _ORIGINAL_BYTES.findall(raw)


@settings(max_examples=400, deadline=None)
@given(_TEXTS, st.integers(1, 10_000))
def test_a_cut_at_a_class_run_end_splits_the_tokens_in_two(text: str, at: int) -> None:
    if not text:
        return
    at = min(at, len(text)) - 1
    cut = tk._CLASS_RUN_RE.match(text, at).end()
    assert _ORIGINAL.findall(text[:cut]) + _ORIGINAL.findall(text[cut:]) == _ORIGINAL.findall(text)


@pytest.mark.parametrize("limit", [0, 1, 2, 3, 7, 64])
@pytest.mark.parametrize("blank", [" ", "\u3000", "\x1c"])
def test_edges_of_the_slices_and_the_read_bound(limit: int, blank: str) -> None:
    """Texts whose runs straddle the first slice's end, the next slices' ends and the read bound."""
    tok = WordTokenizer()
    stop = limit + 1
    bound = 2 * MAX_TOKEN_CHARS * (stop + 1) + 1
    for edge in (FAST_SCAN_CHARS_PER_TOKEN * stop, 2 * FAST_SCAN_CHARS_PER_TOKEN * stop, bound):
        for shift in range(-70, 71, 7):
            for run in (63, 64, 65, 130, 3 * bound):
                lead = max(0, edge + shift)
                for text in (blank * lead + "a" + blank * run + "b",
                             "x" * lead + blank * run + "y" * 200,
                             (blank * 64 + "w") * (lead // 65) + blank * run + "€" * 3,
                             "!" * min(lead, 3 * stop) + (blank * 64 + "q") * stop + blank * run):
                    assert tok.encode(text, limit) == _oracle(text, limit), (edge, shift, run)


class _Reads:
    """Wraps a compiled pattern; counts the characters it is asked to read."""

    def __init__(self, real: re.Pattern) -> None:
        self.real, self.chars = real, 0

    def findall(self, s):
        self.chars += len(s)
        return self.real.findall(s)

    def finditer(self, s):  # match by match: as far as the last match read
        last = 0
        for m in self.real.finditer(s):
            self.chars += m.end() - last
            last = m.end()
            yield m


@pytest.mark.parametrize("blank", [" ", "\u3000", "\t \n "])
def test_the_per_blank_pattern_reads_only_the_first_slice(monkeypatch, blank) -> None:
    """The attack of R4b-1: tokens separated by 64 blanks, refused over the default 8192 tokens.

    ``_TOKEN_RE`` (and its ASCII twin) fail once per blank of a free run; before this change they read
    the whole 532 K characters up to the 8193rd token (~37 ms). Now only the first slice
    (4 x 8193 characters and the rest of a run); the rest is read by the one-step pattern, and no
    more than the 128 x (limit + 2) + 1 characters the limit's tokens can span.
    """
    per_blank = {n: _Reads(getattr(tk, n)) for n in ("_TOKEN_RE", "_ASCII_TOKEN_RE")}
    one_step = {n: _Reads(getattr(tk, n)) for n in ("_SPARSE_TOKEN_RE", "_ASCII_SPARSE_TOKEN_RE")}
    for name, wrapped in {**per_blank, **one_step}.items():
        monkeypatch.setattr(tk, name, wrapped)
    limit = 8192
    text = (blank * (64 // len(blank)) + "a") * 8300
    ids = WordTokenizer().encode(text, limit)
    assert ids == _oracle(text, limit) and len(ids) == limit + 1
    first_slice = sum(r.chars for r in per_blank.values())
    assert first_slice <= FAST_SCAN_CHARS_PER_TOKEN * (limit + 1) + 64, first_slice  # was ~532,500
    assert first_slice + sum(r.chars for r in one_step.values()) <= 2 * 64 * (limit + 2) + 1
