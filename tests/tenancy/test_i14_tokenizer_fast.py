"""Issue 14: the faster WordTokenizer.encode (one C-level regex scan, hashing inlined) yields
exactly the ids of the original token-by-token scan, with and without a limit. (Session 3: the
ids are CRC-32 digests, name ``word-crc32-v2``; the token strings are unchanged.)"""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from tenancy.tokenizer import _TOKEN_RE, MAX_TOKEN_CHARS, WordTokenizer


def reference_encode(text: str, limit: int | None) -> list[int]:
    """The encode of issue 12 (before issue 14), kept as the specification."""
    out: list[int] = []
    stop = None if limit is None else max(0, limit) + 1
    step = MAX_TOKEN_CHARS
    for match in _TOKEN_RE.finditer(text):
        m = match.group()
        if len(m) > step and m[0].isspace():
            pieces = [m[i:i + step] for i in range(0, min(len(m), step * (stop or len(m))), step)]
        else:
            pieces = [m]
        for piece in pieces:
            out.append(zlib.crc32(piece.encode("utf-8")))
            if stop is not None and len(out) >= stop:
                return out
    return out


_pieces = st.one_of(
    st.text(alphabet="ab1_é", min_size=1, max_size=150),           # words, some longer than 64
    st.sampled_from([" ", "\n", "\t ", " " * 65, " " * 200, "\u3000" * 70]),  # blank runs, some long
    st.text(alphabet="!?.,<|>-", min_size=1, max_size=5),            # symbols
    st.text(max_size=20),                                             # anything
)
texts = st.lists(_pieces, max_size=40).map("".join)
limits = st.one_of(st.none(), st.integers(min_value=-1, max_value=70))


@settings(max_examples=400, deadline=None)
@given(texts, limits)
def test_fast_encode_equals_reference(text: str, limit: int | None) -> None:
    assert WordTokenizer().encode(text, limit) == reference_encode(text, limit)


def test_long_text_with_a_small_limit_takes_the_bounded_scan() -> None:
    text = "word " * 10_000 + " " * 10_000
    for limit in (0, 1, 63, 64, 500):
        assert WordTokenizer().encode(text, limit) == reference_encode(text, limit)
    blank = " " * 100_000 + "x"
    for limit in (0, 3, 2000):
        assert WordTokenizer().encode(blank, limit) == reference_encode(blank, limit)
