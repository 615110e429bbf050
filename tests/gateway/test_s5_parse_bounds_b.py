"""Review R4b-2 (session 5): tool calls count against ``max_messages`` with the content parts, and a
long digit run inside a JSON string no longer sends the body to :mod:`json` with a Python ``parse_int``
call per integer (only a run outside strings does: an integer or float literal)."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import json_fast
from gateway.errors import GatewayError
from gateway.request import MAX_INT_DIGITS, parse_inference_request
from tenancy.bounds import chat_units

_CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def _chat(messages: list[dict]) -> bytes:
    return json.dumps({"model": "m", "messages": messages}).encode()


# ---------------------------------------------------------------- tool calls

def test_many_tool_calls_in_one_message_are_refused_before_schema_validation() -> None:
    body = _chat([{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [_CALL] * 5000}])
    with pytest.raises(GatewayError) as exc:  # before: accepted (review: 23.5 ms at 1638)
        parse_inference_request(body, "chat", max_messages=1638)
    assert exc.value.status == 400 and exc.value.code == "too_many_content_parts"
    assert exc.value.param == "messages" and "tool calls" in exc.value.message


def test_tool_calls_count_with_parts_and_messages() -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}] * 3},   # 3
            {"role": "assistant", "content": None, "tool_calls": [_CALL] * 4},  # 4
            {"role": "assistant", "content": "see", "tool_calls": [_CALL] * 2},  # 1 + 2
            {"role": "tool", "tool_call_id": "call_1", "content": "42"}]        # 1
    assert chat_units(msgs) == 11
    assert parse_inference_request(_chat(msgs), "chat", max_messages=11).body["messages"][1]["tool_calls"]
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(_chat(msgs), "chat", max_messages=10)
    assert exc.value.code == "too_many_content_parts"


def test_units_unchanged_without_tool_calls() -> None:
    assert chat_units([{"role": "user", "content": []}, {"role": "user"}, 7, {"content": "x"},
                       {"content": [1, 2]}, {"tool_calls": "no list"}]) == 1 + 1 + 1 + 1 + 2 + 1


# ---------------------------------------------------------------- digit runs inside strings

def test_a_long_digit_run_in_a_string_is_read_by_orjson() -> None:
    run = "1" * 30
    for doc in ('{"id":"%s","n":[1,2,3]}' % run,
                '{"a":"x\\"%s\\"","b":"\\\\","n":[1]}' % run,  # escaped quotes around it, an escaped backslash
                '{"%s":1}' % run):
        value, fast = json_fast.loads_checked(doc.encode(), doc, max_int_digits=MAX_INT_DIGITS)
        assert fast, doc  # before: False (json.loads with a parse_int call per integer)
        assert value == json.loads(doc)


def test_a_long_integer_after_an_escaped_backslash_is_still_refused() -> None:
    # "\\" ends the string: the digits after it are a number, not text
    doc = '{"a":"x\\\\","n":%s}' % ("9" * 21)
    with pytest.raises(json_fast.IntegerTooLong):
        json_fast.loads_checked(doc.encode(), doc, max_int_digits=MAX_INT_DIGITS)
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(b'{"model":"m","prompt":"%s","seed":%s}' % (b"7" * 25, b"1" * 21), "completions")
    assert exc.value.code == "number_too_long"


def test_a_long_integer_is_refused_without_decoding(monkeypatch) -> None:
    """R4b-2 residual: 60,000 small integers, then one of 21 digits: refused at once, not after a Python
    ``parse_int`` call for each of the 60,000 (~12 ms); a long float literal is still read."""
    calls = []
    real = json_fast.json.loads
    monkeypatch.setattr(json_fast.json, "loads", lambda *a, **k: calls.append(k) or real(*a, **k))
    doc = '{"s":"%s","n":[%s,%s]}' % ("5" * 30, ",".join(["1"] * 60000), "9" * 21)
    with pytest.raises(json_fast.IntegerTooLong):
        json_fast.loads_checked(doc.encode(), doc, max_int_digits=MAX_INT_DIGITS)
    assert calls == []  # before: json.loads(parse_int=...) read the 60,000 first
    for doc in ('[%s.5,1,2,\n -%s]' % ("9" * 25, "8" * 21), '{"a":1e%s,"b":"%s","c": %s}' % ("0" * 22, "7" * 22, "6" * 22)):
        with pytest.raises(json_fast.IntegerTooLong):  # a long float first, the long integer later
            json_fast.loads_checked(doc.encode(), doc, max_int_digits=MAX_INT_DIGITS)
    for number in ("9" * 21 + ".5", "1." + "9" * 30, "1e" + "0" * 25, "-" + "9" * 21 + "E2"):
        doc = '{"n":[1,%s]}' % number
        assert json_fast.loads_checked(doc.encode(), doc, max_int_digits=MAX_INT_DIGITS)[0] == json.loads(doc)


def _old_loads_checked(data: bytes, text: str):
    """The decoder's answer before s5 (the oracle): json with the parse_int check when a run is anywhere."""
    if b"0" * (MAX_INT_DIGITS + 1) in data.translate(json_fast._DIGITS):
        return json.loads(text, parse_int=json_fast._bounded_int(MAX_INT_DIGITS))
    return json.loads(text)


_digits = st.text(alphabet="0123456789", min_size=1, max_size=26).map(lambda s: s.lstrip("0") or "0")
_strings = st.text(alphabet=st.sampled_from(list('0123456789ab"\\/ é') + ["\u2028"]), max_size=40)
_scalars = st.one_of(_strings, _digits.map(int), st.builds(lambda d, f: float(f"{d}.{f}"), _digits, _digits),
                     st.booleans(), st.none())
_values = st.recursive(_scalars, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                         st.dictionaries(_strings, inner, max_size=5)), max_leaves=20)


def _outcome(fn, *args):
    try:
        return "ok", json.dumps(fn(*args), sort_keys=True)
    except (json_fast.IntegerTooLong, ValueError, RecursionError) as exc:
        return type(exc).__name__, None


@settings(max_examples=500, deadline=None)
@given(_values, st.sampled_from(["", "x", ",", "]", "}", '"', "\\", " 1", "NaN"]), st.integers(0, 3))
def test_same_answer_as_before_on_valid_and_broken_documents(value, tail, cut) -> None:
    text = json.dumps({"v": value}, ensure_ascii=False)
    text = (text[:-cut] if cut else text) + tail
    raw = text.encode()
    got = _outcome(lambda: json_fast.loads_checked(raw, text, max_int_digits=MAX_INT_DIGITS)[0])
    want = _outcome(_old_loads_checked, raw, text)
    if got != want:  # only change: a long integer after the point where json finds a document broken
        assert got == ("IntegerTooLong", None) and want == ("JSONDecodeError", None), (got, want)
