"""Session 3 (issues 14/15, time scale 20): WordTokenizer ids come from C-level CRC-32 over the
token texts (no per-token Python loop); the token strings are those of the issue-12 scan.

The reference below spells the specification independently of ``tenancy.tokenizer``: a literal
copy of the issue-12 pattern, scanned token by token, each token's id its CRC-32.
"""

from __future__ import annotations

import re
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenancy.tokenizer import WordTokenizer

# the issue-12 pattern, copied (not imported): the token strings must not change
OLD_PATTERN = re.compile(r"\w{1,64}|[^\w\s]|\s{65,}", re.UNICODE)


def reference_tokens(text: str, limit: int | None) -> list[str]:
    """Token strings of ``text`` as issue 12 defined them, cut at ``limit + 1``."""
    out: list[str] = []
    stop = None if limit is None else max(0, limit) + 1
    for match in OLD_PATTERN.finditer(text):
        m = match.group()
        pieces = [m[i:i + 64] for i in range(0, len(m), 64)] if len(m) > 64 else [m]
        for piece in pieces:
            out.append(piece)
            if stop is not None and len(out) >= stop:
                return out
    return out


def reference_ids(text: str, limit: int | None = None) -> list[int]:
    return [zlib.crc32(t.encode("utf-8")) for t in reference_tokens(text, limit)]


_pieces = st.one_of(
    st.text(alphabet="ab1_é\U0001d400", min_size=1, max_size=150),  # words, some longer than 64
    st.sampled_from([" ", "\n", "\t ", " " * 64, " " * 65, " " * 200, "\u3000" * 70, "\u2028\u00a0" * 40,
                     "\n" * 70, "é\n" + "\n \u3000" * 30]),
    st.text(alphabet="!?.,<|>-—", min_size=1, max_size=5),            # symbols
    st.text(max_size=20).filter(lambda s: not any(0xD800 <= ord(c) < 0xE000 for c in s)),
)
texts = st.lists(_pieces, max_size=40).map("".join)
limits = st.one_of(st.none(), st.integers(min_value=-1, max_value=70))


@settings(max_examples=500, deadline=None)
@given(texts, limits)
def test_ids_are_crc32_of_the_issue12_token_strings(text: str, limit: int | None) -> None:
    assert WordTokenizer().encode(text, limit) == reference_ids(text, limit)


def test_long_texts_with_small_limits_take_the_bounded_scan() -> None:
    for text in ("word " * 10_000 + " " * 10_000, " " * 100_000 + "x", "x" * 100_000, "!" * 70_000):
        for limit in (0, 1, 63, 64, 500, 2000):
            assert WordTokenizer().encode(text, limit) == reference_ids(text, limit)


def test_pinned_vectors_and_name() -> None:
    tok = WordTokenizer()
    # the name is part of cache-compatibility checks: the ids changed, so did the name
    assert tok.name == "word-crc32-v2" and tok.name != "word-blake2b-32"
    assert tok.encode("Hello, world!") == [0xF7D18982, 0xE0DA836E, 0x3A771143, 0x9E6BFFD3]
    assert tok.token_id("Hello") == 0xF7D18982
    assert all(0 <= i < 2**32 for i in tok.encode("é \U0001d400 x" * 10))


def test_no_state_is_kept_between_calls() -> None:
    """No memo across calls (a shared memo is a cross-tenant timing channel, test_timing_probe)."""
    tok = WordTokenizer()
    before = dict(vars(tok))
    tok.encode("some words some words " * 50)
    assert vars(tok) == before
    with pytest.raises(TypeError):
        WordTokenizer(cache_size=16)  # type: ignore[call-arg]


# ASCII texts take a bytes scan (no str.encode per token): every ASCII character class matters,
# in particular \x1c-\x1f, which str's \s matches and bytes' \s does not
_ascii_pieces = st.one_of(
    st.text(alphabet=st.characters(max_codepoint=127), max_size=30),
    st.text(alphabet="aZ09_", min_size=60, max_size=140),
    st.sampled_from([" " * 65, "\x1c" * 64, "\x1f" + " " * 64, "\t\n\r\x0b\x0c" * 14, "\x1d\x1e" * 33]),
)
ascii_texts = st.lists(_ascii_pieces, max_size=30).map("".join)


@settings(max_examples=500, deadline=None)
@given(ascii_texts, limits)
def test_ascii_texts_give_the_same_tokens(text: str, limit: int | None) -> None:
    assert text.isascii()
    assert WordTokenizer().encode(text, limit) == reference_ids(text, limit)


def test_every_ascii_character_alone_and_in_context() -> None:
    tok = WordTokenizer()
    for c in map(chr, range(128)):
        for text in (c, f"a{c}b", c * 65, f"x{c * 70}y"):
            assert tok.encode(text) == reference_ids(text), repr(text)


def test_a_lone_surrogate_is_refused_as_before() -> None:
    for text in ("a \udc80 b", "\udc80", "é \ud800", "x" + " " * 70 + "\udc80"):
        with pytest.raises(UnicodeEncodeError):
            WordTokenizer().encode(text)
