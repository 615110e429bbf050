"""Session 23, S23-review-1: the long-integer scan of ``json_fast.loads_checked`` (s5, R4b-2) in two patterns.

The one pattern ``(?:\\A|[\\[,:])...`` made ``re`` try the whole pattern at every byte after the first long digit
run (~28 ms of event-loop CPU per MB of digits: a float literal of a million digits in an accepted body); a
pattern that starts with a character set is searched by that set. The speed lives in
bench/results/review-s23-integer-scan.md; here: the answer is the one pattern's, for every text and start.
"""
from __future__ import annotations

import json
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


# ---------------------------------------------------------------- orjson's value for long float digit runs

def _float_literal(draw: st.DrawFn) -> str:
    whole = draw(st.integers(1, 40).map(lambda n: "1" + "0" * (n - 1)) | st.text("0123456789", min_size=1,
                                                                                   max_size=30).map(lambda t: t.lstrip("0") or "0"))
    frac = draw(st.text("0123456789", max_size=45))
    exp = draw(st.none() | st.integers(-340, 300).map(str) | st.text("0123456789", min_size=19, max_size=25))
    lit = draw(st.sampled_from(["", "-"])) + whole + ("." + frac if frac else "")
    if exp is not None or not frac:
        lit += draw(st.sampled_from(["e", "E"])) + (exp if exp is not None else str(draw(st.integers(-20, 20))))
    return lit


@st.composite
def _number_docs(draw: st.DrawFn) -> str:
    """A JSON text whose numbers are written as literals: floats with long digit runs, integers of 1-25 digits,
    strings holding digit runs."""
    leaf = st.one_of(
        st.composite(lambda d: _float_literal(d))(),
        st.integers(1, 25).map(lambda n: "9" * n), st.integers(1, 25).map(lambda n: "-" + "1" * n),
        st.text("0123456789ab", max_size=30).map(lambda t: '"' + t + '"'))
    tree = st.recursive(leaf, lambda c: st.one_of(
        st.lists(c, max_size=5).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(c, max_size=5).map(lambda xs: "{" + ",".join(f'"k{i}": {x}' for i, x in enumerate(xs)) + "}")),
        max_leaves=12)
    return draw(tree.map(lambda t: '{"model": "m", "x": ' + t + "}"))


def _same(a: object, b: object) -> bool:
    """Equal values of the same types all the way down (1 is not 1.0, -0.0 is not 0.0)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)  # type: ignore[index]
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))  # type: ignore[arg-type]
    if isinstance(a, float):
        return repr(a) == repr(b)
    return a == b


@settings(max_examples=1500, deadline=None)
@given(_number_docs())
def test_checked_value_is_jsons_or_the_integer_refusal(doc: str) -> None:
    raw = doc.encode()
    try:
        want: object = json.loads(doc)
    except ValueError:
        return  # (an exponent run json cannot convert would raise; not generated in practice)
    too_long = re.search(r"(?:^|[\[,:])\s*-?[0-9]{%d,}(?![.eE0-9])" % (MAX_INT_DIGITS + 1), re.sub(r'"[^"]*"', '""', doc))
    if too_long or any(isinstance(v, float) and v in (float("inf"), float("-inf")) for v in _leaves(want)):
        with pytest.raises((json_fast.IntegerTooLong, json_fast.NonFiniteLiteral)):
            json_fast.loads_checked(raw, doc, max_int_digits=MAX_INT_DIGITS, max_depth=32, strict_numbers=True)
        return
    got, fast = json_fast.loads_checked(raw, doc, max_int_digits=MAX_INT_DIGITS, max_depth=32, strict_numbers=True)
    assert _same(got, want)
    long_int = re.search(r"(?:^|[\[,:])\s*-?[0-9]{19,}(?![.eE0-9])", re.sub(r'"[^"]*"', '""', doc))
    if long_int is None:  # no integer literal of 19 digits or more: orjson's value (with one: json's, or s7's flat case)
        assert fast


def _leaves(v: object) -> list[object]:
    if isinstance(v, dict):
        return [x for y in v.values() for x in _leaves(y)]
    if isinstance(v, list):
        return [x for y in v for x in _leaves(y)]
    return [v]


def test_a_float_of_a_million_digits_is_orjsons_value_unread_again() -> None:
    raw = b'{"model":"m","temperature":1.' + b"0" * 1_000_000 + b"1}"
    value, fast = json_fast.loads_checked(raw, raw.decode(), max_int_digits=MAX_INT_DIGITS, max_depth=32,
                                          strict_numbers=True)
    assert fast and value["temperature"] == 1.0 and _same(value, json.loads(raw))
