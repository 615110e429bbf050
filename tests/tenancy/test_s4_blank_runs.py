"""Review R4b-1: blank runs are tried as a token only where they start (``(?<!\\s)``), which removes
the rescan of every short run from each of its positions, and changes no token (the old patterns
are the oracle here)."""
from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from tenancy import tokenizer as tk

_OLD_STR = re.compile(r"\w{1,%d}|[^\w\s]|\s{%d,}" % (tk.MAX_TOKEN_CHARS, tk.MAX_TOKEN_CHARS + 1), re.UNICODE)
_OLD_BYTES = re.compile(rb"[A-Za-z0-9_]{1,%d}|[^A-Za-z0-9_\s\x1c-\x1f]|[\s\x1c-\x1f]{%d,}"
                        % (tk.MAX_TOKEN_CHARS, tk.MAX_TOKEN_CHARS + 1))

_PIECES = st.sampled_from([" ", "\t", "\n", "\x1c", "\u3000", "a", "_", "1", "é", "!", "€"])
_TEXTS = st.lists(st.tuples(_PIECES, st.sampled_from([1, 2, 63, 64, 65, 66, 129, 130])), max_size=30).map(
    lambda parts: "".join(p * n for p, n in parts))


@settings(max_examples=400, deadline=None)
@given(_TEXTS)
def test_same_tokens_as_the_old_patterns(text: str) -> None:
    assert tk._TOKEN_RE.findall(text) == _OLD_STR.findall(text)
    if text.isascii():
        raw = text.encode("ascii")
        assert tk._ASCII_TOKEN_RE.findall(raw) == _OLD_BYTES.findall(raw)


def test_a_blank_run_is_not_tried_from_inside() -> None:
    # the old pattern could try \s{65,} at every blank; the new one only where a run starts
    text = " " * 200
    assert [m.start() for m in tk._TOKEN_RE.finditer(text)] == [0]
    assert tk._TOKEN_RE.match(text, 1) is None  # position 1 is inside the run: no match starts there
    assert _OLD_STR.match(text, 1) is not None  # (the old pattern did start one there)
    assert tk._ASCII_TOKEN_RE.match(text.encode(), 1) is None
