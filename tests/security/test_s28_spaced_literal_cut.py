"""Session 28 (cut28, issue 14): the fast cut of a ``drop`` tenant's plain answer (gateway/usage_privacy.py
``_exact_cut``) searches the spaced writers' pair (``, "prompt_tokens_details": {"cached_tokens": N}``: Python's
``json.dumps`` defaults, aiohttp's ``json_response``, the simulated replicas) as one literal before reading the
tokens one by one. Property: on any answer (random member order, duplicated keys, nested copies, string values
holding the keys' bytes), what is relayed is byte for byte what the tree before this session relayed (the
literal disabled), a cut the caller keeps (no counter left in it) is byte for byte the token-by-token read's, and
the relayed bytes parse to the full rewrite. (A literal found on an earlier copy leaves the counter in its cut:
the caller's check sends it to the next way, as the compact literal's since session 13.)"""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from gateway import usage_privacy
from gateway.usage_privacy import _exact_cut, may_name_cached, plain_without_cached, without_counter

_COUNT = st.integers(min_value=-3, max_value=9000)
_TEXT = st.lists(st.sampled_from(list('ab "\\{}:,\n') + ['"usage"', '"cached_tokens"', ', "prompt_tokens_details": ',
                                                            ', "prompt_tokens_details": {"cached_tokens": 3}',
                                                            ',"prompt_tokens_details":{"cached_tokens":3}']),
                 max_size=6).map("".join)
_DETAILS = st.one_of(
    _COUNT.map(lambda n: [("cached_tokens", n)]),  # vLLM's shape
    st.tuples(_COUNT, _COUNT).map(lambda t: [("cached_tokens", t[0]), ("audio_tokens", t[1])]),
    st.tuples(_COUNT, _COUNT).map(lambda t: [("audio_tokens", t[1]), ("cached_tokens", t[0])]),
    st.tuples(_COUNT, _COUNT).map(lambda t: [("cached_tokens", t[0]), ("cached_tokens", t[1])]),  # duplicated
    st.just([("cached_tokens", 2.0)]),  # not an int: never the fast cut
    st.just([("audio_tokens", 1)]),
    st.just([]),
)


def _obj(members: list[tuple[str, Any]]) -> str:
    """A JSON object of ``members`` (duplicated keys kept) as ``json.dumps`` spaces it (``", "``, ``": "``)."""
    return "{" + ", ".join(json.dumps(k) + ": " + (v if isinstance(v, _Raw) else json.dumps(v)) for k, v in members) + "}"


class _Raw(str):
    """JSON text written as is."""


@st.composite
def spaced_answers(draw: Any) -> bytes:
    details = _Raw(_obj(draw(_DETAILS)))
    members: list[tuple[str, Any]] = [("prompt_tokens", draw(_COUNT)), ("completion_tokens", draw(_COUNT)),
                                      ("prompt_tokens_details", details)]
    if draw(st.booleans()):
        members.append(("total_tokens", draw(_COUNT)))
    members = list(draw(st.permutations(members)))
    if draw(st.integers(0, 4)) == 0:  # a duplicated details key before the one the parse keeps
        members.insert(draw(st.integers(0, len(members))), ("prompt_tokens_details", _Raw(_obj(draw(_DETAILS)))))
    usage = _Raw(_obj(members))
    choice: list[tuple[str, Any]] = [("index", 0), ("text", draw(_TEXT))]
    if draw(st.integers(0, 3)) == 0:  # a nested copy (R14-2)
        choice.append(("usage", usage))
    top: list[tuple[str, Any]] = [("id", draw(_TEXT)), ("choices", _Raw("[" + _obj(choice) + "]")), ("usage", usage)]
    top = list(draw(st.permutations(top)))
    if draw(st.integers(0, 4)) == 0:  # a duplicated usage
        top.insert(0, ("usage", _Raw(_obj([("prompt_tokens", 1), ("prompt_tokens_details", _Raw(_obj(draw(_DETAILS))))]))))
    return _obj(top).encode()


def _token_read(data: bytes, details: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> bytes | None:
    """``_exact_cut`` without the spaced literal (a literal no JSON text holds): the token-by-token read."""
    with monkeypatch.context() as m:
        m.setattr(usage_privacy, "_SPACED_DETAILS", b"\x00never\x00")
        return _exact_cut(data, details)


@settings(max_examples=2000, deadline=None)
@given(spaced_answers())
def test_spaced_literal_cut_equals_the_token_read(data: bytes) -> None:
    mp = pytest.MonkeyPatch()
    try:
        parsed = orjson.loads(data)
        usage = parsed.get("usage")
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        if isinstance(details, dict) and "cached_tokens" in details:
            cut = _exact_cut(data, details)
            if cut is not None and cut.rfind(b'"cached_tokens"') < 0:  # a cut the caller keeps: the token read's
                assert cut == _token_read(data, details, mp)
        if (isinstance(usage, dict) and "prompt_tokens_details" in usage) or may_name_cached(data):
            out = plain_without_cached(data, parsed, usage)
            with mp.context() as m:  # what goes out: byte for byte the tree's before the literal
                m.setattr(usage_privacy, "_SPACED_DETAILS", b"\x00never\x00")
                assert out == plain_without_cached(data, parsed, usage)
            assert orjson.loads(out) == without_counter(parsed)
            assert b'"cached_tokens"' not in out
    finally:
        mp.undo()


def test_the_simulators_answer_takes_the_literal(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated replica's answer (aiohttp ``json_response``) is cut by the literal, to the bytes
    ``json.dumps`` writes for the answer without the pair; a literal that fails (here: disabled) still
    cuts the same bytes by the token read."""
    obj = {"id": "cmpl-1", "object": "text_completion", "choices": [{"index": 0, "text": "x"}],
           "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6,
                     "prompt_tokens_details": {"cached_tokens": 4}}}
    data = json.dumps(obj).encode()
    want = json.dumps(without_counter(obj)).encode()
    calls: list[int] = []
    real = usage_privacy._PAIR

    class Spy:
        def match(self, *a: Any) -> Any:
            calls.append(1)
            return real.match(*a)

    monkeypatch.setattr(usage_privacy, "_PAIR", Spy())
    assert _exact_cut(data, obj["usage"]["prompt_tokens_details"]) == want
    assert calls == []  # the literal answered: no token read
    monkeypatch.setattr(usage_privacy, "_SPACED_DETAILS", b"\x00never\x00")
    assert _exact_cut(data, obj["usage"]["prompt_tokens_details"]) == want
    assert calls == [1]


@settings(max_examples=1500, deadline=None)
@given(spaced_answers(), st.sampled_from(["spaced", "compact", "lines"]))
def test_usage_event_for_a_drop_tenant_is_one_line_without_the_counter(data: bytes, form: str) -> None:
    """A stream data event (one line, spaced or compact, or several data lines joined with LF) for a ``drop``
    tenant: one ``data:`` line, parsing to the full rewrite, naming no counter; one line in, the cut's bytes
    (so, when the literal can prove it, the replica's bytes less the pair)."""
    payload = {"spaced": data, "compact": data.replace(b", ", b",").replace(b": ", b":"),
               "lines": data.replace(b", ", b",\n")}[form]
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError:  # an LF written inside a string (not a replica's event)
        assume(False)
    out = usage_privacy.event_for_drop(payload, obj)
    if out is None:  # nothing a parser could read as the counter
        assert not may_name_cached(payload)
        return
    assert out[:6] == b"data: " and out[-2:] == b"\n\n"
    body = out[6:-2]
    assert b"\n" not in body and b"\r" not in body
    assert b'"cached_tokens"' not in body
    assert orjson.loads(body) == without_counter(obj)
    if form != "lines":
        assert body == plain_without_cached(payload, obj, obj.get("usage"))
