"""Session 16, A15-1: the fast cut of a ``drop`` tenant's plain answer (gateway/usage_privacy.py
``_exact_cut``) tolerates RFC 8259 insignificant whitespace (space, tab, LF, CR) between the tokens, as
aiohttp's ``json_response`` and Python's ``json.dumps`` write them, with the same fail-closed rule: what
it cannot prove it handles exactly goes to the full rewrite.

Property (answers written with random whitespace between every two tokens, keys spelt with ``\\u``
escapes, duplicated ``usage`` / ``prompt_tokens_details`` / ``cached_tokens`` keys, copies of the usage
below the top level, string values holding the keys' bytes): what the answer path relays parses to
exactly the full rewrite's object (:func:`without_counter` of the parse) and never names the counter;
and whenever the fast cut itself answers, its bytes parse to that same object."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from itertools import cycle
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.usage_privacy import _exact_cut, may_name_cached, plain_without_cached, without_counter


class Obj(list):  # type: ignore[type-arg]
    """A JSON object as its (key, value) members in order: duplicated keys can be written."""


_WS = st.lists(st.sampled_from(["", " ", "  ", "\t", "\n", "\r\n", "\n  ", "\r"]), min_size=1, max_size=6)
_ESCAPABLE = {"cached_tokens": "cached\\u005ftokens", "usage": "\\u0075sage",
              "prompt_tokens_details": "prompt_tokens_detail\\u0073"}
_TEXT = st.lists(st.sampled_from(list('ab "\\{}:,\n') + ['"usage"', '"cached_tokens"', "usage", ' : ',
                                                            '"prompt_tokens_details": {"cached_tokens": 3}',
                                                            ',"prompt_tokens_details":{"cached_tokens":3}']),
                 max_size=6).map("".join)


def _write(value: Any, ws: Callable[[], str], escaped: frozenset[str]) -> str:
    """``value`` as JSON text with ``ws()`` between every two tokens; keys in ``escaped`` spelt with an escape."""
    if isinstance(value, Obj):
        if not value:
            return "{" + ws() + "}"
        members = []
        for key, item in value:
            name = '"' + _ESCAPABLE[key] + '"' if key in escaped else json.dumps(key)
            members.append(ws() + name + ws() + ":" + ws() + _write(item, ws, escaped) + ws())
        return "{" + ",".join(members) + "}"
    if isinstance(value, list):
        if not value:
            return "[" + ws() + "]"
        return "[" + ",".join(ws() + _write(item, ws, escaped) + ws() for item in value) + "]"
    return json.dumps(value)


_COUNT = st.integers(min_value=0, max_value=9000)
_DETAILS = st.one_of(
    _COUNT.map(lambda n: Obj([("cached_tokens", n)])),  # vLLM's shape
    st.tuples(_COUNT, _COUNT).map(lambda t: Obj([("cached_tokens", t[0]), ("audio_tokens", t[1])])),
    st.tuples(_COUNT, _COUNT).map(lambda t: Obj([("audio_tokens", t[1]), ("cached_tokens", t[0])])),
    st.tuples(_COUNT, _COUNT).map(lambda t: Obj([("cached_tokens", t[0]), ("cached_tokens", t[1])])),  # duplicated
    st.just(Obj([("audio_tokens", 1)])),
    st.just(Obj()),
    st.just(Obj([("cached_tokens", 2.0)])),  # not an int: never the fast cut
)


@st.composite
def answers(draw: Any) -> Obj:
    members = [("prompt_tokens", draw(_COUNT)), ("completion_tokens", draw(_COUNT)),
               ("prompt_tokens_details", draw(_DETAILS))]
    if draw(st.booleans()):
        members.append(("total_tokens", draw(_COUNT)))
    members = list(draw(st.permutations(members)))
    if draw(st.integers(0, 4)) == 0:  # a duplicated prompt_tokens_details before the one the parse keeps
        members.insert(0, ("prompt_tokens_details", draw(_DETAILS)))
    usage = Obj(members)
    message = Obj([("role", "assistant"), ("content", draw(_TEXT))])
    choice = Obj([("index", 0), ("message", message)])
    if draw(st.integers(0, 3)) == 0:  # a nested copy (session 15, R14-2: its counter goes too)
        choice.append(("usage", draw(st.sampled_from([usage, Obj([("prompt_tokens_details", Obj([("cached_tokens", 3)]))])]))))
    top = [("id", draw(_TEXT)), ("choices", [choice]), ("usage", usage)]
    if draw(st.booleans()):
        top.append(("model", draw(_TEXT)))
    top = list(draw(st.permutations(top)))
    if draw(st.integers(0, 4)) == 0:  # a duplicated usage: the parse keeps the last, some clients the first
        top.insert(0, ("usage", Obj([("prompt_tokens", 1), ("prompt_tokens_details", draw(_DETAILS))])))
    return Obj(top)


def _names_counter(value: Any) -> bool:
    if isinstance(value, dict):
        return "cached_tokens" in value or any(_names_counter(v) for v in value.values())
    if isinstance(value, list):
        return any(_names_counter(v) for v in value)
    return False


def _relayed(data: bytes, parsed: dict[str, Any]) -> bytes:
    """What gateway/pipeline_answer.py ``plain_response`` relays to a ``drop`` tenant."""
    usage = parsed.get("usage")
    if (isinstance(usage, dict) and "prompt_tokens_details" in usage) or may_name_cached(data):
        return plain_without_cached(data, parsed, usage)
    return data


@settings(max_examples=1500, deadline=None)
@given(answers(), _WS, st.sets(st.sampled_from(sorted(_ESCAPABLE)), max_size=2).map(frozenset))
def test_spaced_answers_relay_the_full_rewrite_and_never_the_counter(obj: Obj, spaces: list[str],
                                                                     escaped: frozenset[str]) -> None:
    gaps: Iterator[str] = cycle(spaces)
    data = _write(obj, lambda: next(gaps), escaped).encode()
    parsed = orjson.loads(data)
    full = without_counter(parsed)
    out = _relayed(data, parsed)
    relayed = orjson.loads(out)
    assert relayed == full
    assert b'"cached_tokens"' not in out and not _names_counter(relayed)
    usage = parsed.get("usage")
    details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
    if isinstance(details, dict) and "cached_tokens" in details:
        cut = _exact_cut(data, details)
        if cut is not None and cut.rfind(b'"cached_tokens"') < 0:  # the fast path's own answer
            assert orjson.loads(cut) == full


_SPACED = [
    (", ", ": "),  # json.dumps defaults, aiohttp json_response
    (",", ": "),
    (" , ", " : "),
    (",\n", ":\t"),
    (",\r\n  ", ":\r\n"),
]


@pytest.mark.parametrize(("item", "key"), _SPACED)
@pytest.mark.parametrize("first", [False, True])
def test_spaced_vllm_shape_takes_the_fast_cut(item: str, key: str, first: bool) -> None:
    usage: dict[str, Any] = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}
    usage = {"prompt_tokens_details": {"cached_tokens": 8}, **usage} if first else {**usage,
                                                                                  "prompt_tokens_details": {"cached_tokens": 8}}
    obj = {"id": "cmpl-1", "choices": [{"index": 0, "text": "a b"}], "usage": usage}
    data = json.dumps(obj, separators=(item, key)).encode()
    parsed = orjson.loads(data)
    cut = _exact_cut(data, parsed["usage"]["prompt_tokens_details"])
    assert cut is not None  # was None for every spaced shape before session 16 (the slow rewrite)
    assert orjson.loads(cut) == without_counter(parsed)
    assert b"cached_tokens" not in cut
    assert plain_without_cached(data, parsed, parsed["usage"]) == cut


def test_aiohttp_shape_is_cut_byte_for_byte() -> None:
    """The simulator's answer (aiohttp ``json_response``: ``json.dumps`` defaults) loses exactly the pair."""
    data = (b'{"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "x"}], "usage": '
            b'{"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6, "prompt_tokens_details": '
            b'{"cached_tokens": 4}}}')
    parsed = orjson.loads(data)
    out = plain_without_cached(data, parsed, parsed["usage"])
    assert out == (b'{"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "x"}], "usage": '
                   b'{"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}')


@pytest.mark.parametrize("data", [
    # the last pair's key opens with an escaped quote (a key ``x"prompt_tokens_details``): not cut there
    b'{"usage": {"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": 4}}, '
    b'"x\\"prompt_tokens_details": {"cached_tokens": 4}, "y": 1}',
    # the pair's bytes inside a string (escaped quotes): never cut there
    b'{"usage": {"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": 4}}, '
    b'"x": "\\"prompt_tokens_details\\": {\\"cached_tokens\\": 4}"}',
    # the pair is the only member: no comma to take with it
    b'{"usage": {"prompt_tokens_details": {"cached_tokens": 4}}}',
    # a duplicated details key before the one the parse keeps
    b'{"usage": {"prompt_tokens_details": {"audio_tokens": 1}, "prompt_tokens": 1, '
    b'"prompt_tokens_details" : {"cached_tokens": 4}}}',
    # a number the parse reads as an int but not written as digits only
    b'{"usage": {"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": 4e0}}}',
])
def test_shapes_the_cut_cannot_prove_go_to_the_rewrite(data: bytes) -> None:
    parsed = orjson.loads(data)
    out = _relayed(data, parsed)
    assert orjson.loads(out) == without_counter(parsed)
    assert b'"cached_tokens"' not in out
