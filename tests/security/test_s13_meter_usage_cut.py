"""Session 13 (meter, issue 14): ``plain_without_cached`` returns the compact cut without building a new
usage dict and without a separate uniqueness search (the final ``"cached_tokens"`` check rejects a second
occurrence). Property: on random answers its result parses to exactly the full rewrite's object
(``{**obj, "usage": usage_without_cached(usage)}``; since session 15, R14-2, ``without_counter(obj)``: a
nested copy loses its counter too), never carries the top-level counter, and for an answer written by
orjson (vLLM's compact shape) it is byte for byte the full rewrite (R12-1, R12b-4)."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.usage_privacy import may_name_cached, plain_without_cached, usage_without_cached, without_counter

_TEXT = st.lists(st.sampled_from(list('ab "\\{}:,') + ['"usage"', '"cached_tokens"', "usage",
                                                         '"prompt_tokens_details":{"cached_tokens":3}']),
                 max_size=8).map("".join)
_SCALAR = st.one_of(st.integers(min_value=-5, max_value=10**6), _TEXT, st.none(), st.booleans())
_DETAILS = st.one_of(
    st.integers(min_value=0, max_value=5000).map(lambda n: {"cached_tokens": n}),  # vLLM's shape
    st.fixed_dictionaries({"cached_tokens": st.integers(0, 5000)}, optional={"audio_tokens": st.integers(0, 9)}),
    st.dictionaries(st.sampled_from(["audio_tokens", "cached_tokens", "x"]), _SCALAR, max_size=3),
)


@st.composite
def answers(draw: Any) -> dict[str, Any]:
    usage_items = [("prompt_tokens", draw(st.integers(0, 9000))), ("completion_tokens", draw(st.integers(0, 99))),
                   ("prompt_tokens_details", draw(_DETAILS))]
    if draw(st.booleans()):
        usage_items.append(("total_tokens", draw(st.integers(0, 9999))))
    usage = dict(draw(st.permutations(usage_items)))
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": draw(_TEXT)}}
    if draw(st.booleans()):  # a nested copy of the usage (session 15, R14-2: its counter goes too)
        choice["usage"] = draw(st.sampled_from([usage, {"prompt_tokens_details": {"cached_tokens": 3}}]))
    items = [("id", draw(_TEXT)), ("choices", [choice]), ("usage", usage)]
    if draw(st.booleans()):
        items.append(("model", draw(_TEXT)))
    return dict(draw(st.permutations(items)))


def _write(obj: dict[str, Any], style: int) -> bytes:
    if style == 0:
        return orjson.dumps(obj)
    if style == 1:
        return json.dumps(obj).encode()  # spaces after separators
    return json.dumps(obj, indent=1, ensure_ascii=False).encode()


@settings(max_examples=600, deadline=None)
@given(answers(), st.integers(0, 2))
def test_fast_cut_equals_full_rewrite(obj: dict[str, Any], style: int) -> None:
    data = _write(obj, style)
    parsed = orjson.loads(data)
    usage = parsed["usage"]
    out = plain_without_cached(data, parsed, usage)
    new = usage_without_cached(usage)
    full = without_counter(parsed)  # R14-2: every copy of the counter goes
    if new is None:
        assert orjson.loads(out) == full
        if not may_name_cached(data):  # session 14, RV2-1: else written again from the parse (same object)
            assert out is data
        return
    assert orjson.loads(out) == full and full["usage"] == new
    assert "cached_tokens" not in orjson.loads(out)["usage"].get("prompt_tokens_details", {})
    if style == 0:  # compact orjson bytes: the cut is the full rewrite, byte for byte
        assert out == orjson.dumps(full)


def test_two_compact_occurrences_fall_back_and_drop_the_nested_copy() -> None:
    usage = {"prompt_tokens": 4, "prompt_tokens_details": {"cached_tokens": 3}}
    obj = {"choices": [{"usage": dict(usage)}], "usage": usage}
    data = orjson.dumps(obj)
    out = plain_without_cached(data, orjson.loads(data), usage)
    # session 15, R14-2: the nested copy loses its counter too (it went out before)
    assert orjson.loads(out) == {"choices": [{"usage": {"prompt_tokens": 4}}], "usage": {"prompt_tokens": 4}}
