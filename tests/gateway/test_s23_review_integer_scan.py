"""Session 23, S23-review-1: the long-integer scan of ``json_fast.loads_checked`` (s5, R4b-2) in two patterns.

The one pattern ``(?:\\A|[\\[,:])...`` made ``re`` try the whole pattern at every byte after the first long digit
run (~28 ms of event-loop CPU per MB of digits: a float literal of a million digits in an accepted body); a
pattern that starts with a character set is searched by that set. The speed lives in
bench/results/review-s23-integer-scan.md; here: the answer is the one pattern's, for every text and start.
"""
from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import json_fast
from gateway.errors import GatewayError
from gateway.request import MAX_INT_DIGITS, parse_inference_request


def _old(outside: bytes, pos: int, digits: int) -> bool:
    """The pattern of sessions 5-22, as gateway/json_fast.py searched it."""
    return re.compile(rb"(?:\A|[\[,:])\s*+-?[0-9]{%d,}+(?![.eE])" % digits).search(outside, pos) is not None


_ALPHABET = b"0123456789[],:{} \t\n-.eE+ax"
_texts = st.lists(st.one_of(st.sampled_from([bytes([b]) for b in _ALPHABET]),
                            st.integers(1, 30).map(lambda n: b"7" * n)), max_size=40).map(b"".join)


@settings(max_examples=3000, deadline=None)
@given(_texts, st.integers(0, 45), st.integers(1, 6))
def test_two_patterns_answer_as_the_one_pattern(outside: bytes, pos: int, digits: int) -> None:
    assert json_fast._holds_integer_literal(outside, pos, digits) is _old(outside, pos, digits)


@pytest.mark.parametrize(("outside", "pos", "want"), [
    (b"7" * 21, 0, True),                  # a bare integer document: only the leading pattern finds it
    (b" -" + b"7" * 21, 0, True),
    (b"7" * 21, 1, False),                 # \A is the text's start, not pos
    (b"7" * 21 + b".5", 0, False),         # a float's digits
    (b"[" + b"7" * 21 + b"e5]", 0, False),
    (b"{ : [1, -" + b"7" * 21 + b"]", 0, True),
    (b"{ : [1, -" + b"7" * 21 + b"]", 8, False),
    (b"{ : " + b"7" * 20 + b"}", 0, False),  # 20 digits are allowed
])
def test_cases(outside: bytes, pos: int, want: bool) -> None:
    assert json_fast._holds_integer_literal(outside, pos, MAX_INT_DIGITS + 1) is want
    assert _old(outside, pos, MAX_INT_DIGITS + 1) is want


def test_long_float_literal_still_accepted_and_long_integer_after_it_still_refused() -> None:
    head = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":1.'
    ok = parse_inference_request(head + b"0" * 200_000 + b"}", "chat")
    assert ok.body["temperature"] == 1.0
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(head + b"0" * 200_000 + b',"seed":' + b"1" * 25 + b"}", "chat")
    assert exc.value.code == "number_too_long"
