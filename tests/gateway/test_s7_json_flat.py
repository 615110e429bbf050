"""Session 7, issue 14: ``loads_checked`` takes orjson's value of a flat object (strings, ints, bools,
nulls) without scanning the bytes for long digit runs; the answer is still exactly json's, and an
integer of more than ``max_int_digits`` digits is still refused (orjson reads one beyond 64 bits as a
float, which sends the document down the checked path)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.json_fast import IntegerTooLong, loads_checked

_ints = st.one_of(st.integers(-(1 << 70), 1 << 70), st.integers((1 << 64) - 3, (1 << 64) + 3),
                  st.integers(-(1 << 63) - 3, -(1 << 63) + 3), st.integers(10**18, 10**21))
_flat = st.dictionaries(st.text(max_size=3), st.one_of(_ints, st.text(max_size=25), st.booleans(), st.none(),
                                                      st.text(alphabet="0123456789", min_size=18, max_size=24)),
                        max_size=5)


def _expected(raw: bytes, digits: int | None) -> Any:
    def parse_int(literal: str) -> int:
        if digits is not None and len(literal) - literal.startswith("-") > digits:
            raise IntegerTooLong(digits)
        return int(literal)
    return json.loads(raw, parse_int=parse_int)


@settings(max_examples=500, deadline=None)
@given(_flat, st.sampled_from([None, 19, 20, 21]))
def test_flat_objects_decode_as_json_does(doc: dict[str, Any], digits: int | None) -> None:
    raw = json.dumps(doc).encode()
    try:
        want = _expected(raw, digits)
    except IntegerTooLong:
        with pytest.raises(IntegerTooLong):
            loads_checked(raw, raw.decode(), max_int_digits=digits, max_depth=32)
        return
    got, fast = loads_checked(raw, raw.decode(), max_int_digits=digits, max_depth=32)
    assert got == want
    assert [type(v) for v in got.values()] == [type(v) for v in want.values()]
    if fast:  # orjson's value: no lone surrogate, no non-finite number (the caller skips that check)
        assert all(not isinstance(v, float) for v in got.values())
