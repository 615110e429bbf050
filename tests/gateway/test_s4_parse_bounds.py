"""Session 4 (R4-1, R4-2): content parts and long integer literals are bounded before the costly steps."""
from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import json_fast, request as request_mod
from gateway.errors import GatewayError
from gateway.request import MAX_INT_DIGITS, parse_inference_request


def _chat(content, n_messages: int = 1) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": content}] * n_messages}).encode()


def _parts(n: int) -> list[dict]:
    return [{"type": "text", "text": ""}] * n


class _Counting:
    """Counts schema validations (the costly step the bounds must precede)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        real = request_mod.ChatBody.model_validate

        def counted(data):
            self.calls += 1
            return real(data)
        monkeypatch.setattr(request_mod.ChatBody, "model_validate", counted)


# ---------------------------------------------------------------- R4-1 content parts

def test_many_content_parts_refused_before_schema_validation(monkeypatch) -> None:
    seen = _Counting(monkeypatch)
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(_chat(_parts(21000)), "chat", max_messages=1638, max_json_items=65536)
    assert exc.value.status == 400 and exc.value.code == "too_many_content_parts"
    assert exc.value.param == "messages"
    assert "1638" in str(exc.value.message) and "21000" in str(exc.value.message)
    assert seen.calls == 0


def test_parts_counted_across_messages_against_the_message_bound(monkeypatch) -> None:
    seen = _Counting(monkeypatch)
    # 10 messages of 3 parts = 30 units > 20
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(_chat(_parts(3), 10), "chat", max_messages=20)
    assert exc.value.code == "too_many_content_parts" and seen.calls == 0
    # exactly at the bound: accepted (a string or a one-part content counts as one message)
    assert parse_inference_request(_chat(_parts(2), 10), "chat", max_messages=20).model == "m"
    assert parse_inference_request(_chat(_parts(1), 20), "chat", max_messages=20).model == "m"
    assert parse_inference_request(_chat("x", 20), "chat", max_messages=20).model == "m"
    assert parse_inference_request(_chat(_parts(20)), "chat", max_messages=20).model == "m"
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(_chat(_parts(21)), "chat", max_messages=20)
    assert exc.value.code == "too_many_content_parts"


def test_message_count_error_unchanged() -> None:
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(_chat("x", 21), "chat", max_messages=20)
    assert exc.value.code == "too_many_messages"


def test_malformed_messages_still_reach_schema_validation() -> None:
    body = json.dumps({"model": "m", "messages": [1, None, {"role": "user", "content": {"a": 1}}]}).encode()
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(body, "chat", max_messages=20)
    assert exc.value.code == "invalid_request"


# ---------------------------------------------------------------- R4-2 long integer literals

@pytest.mark.parametrize("where", ["tools", "unknown", "seed", "messages"])
def test_long_integer_literal_refused_anywhere(where) -> None:
    lit = "7" * 4299
    doc = '{"model": "m", "messages": [{"role": "user", "content": "x"}], %s}'
    field = {"tools": '"tools": [{"type": "function", "x": %s}]' % lit,
             "unknown": '"zzz": [%s]' % lit, "seed": '"seed": -%s' % lit,
             "messages": '"messages2": {"a": %s}' % lit}[where]
    with pytest.raises(GatewayError) as exc:
        parse_inference_request((doc % field).encode(), "chat")
    assert exc.value.status == 400 and exc.value.code == "number_too_long"
    assert str(MAX_INT_DIGITS) in exc.value.message


def test_bound_is_twenty_digits() -> None:
    base = '{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "f", "x": %s}]}'
    ok = parse_inference_request((base % ("9" * 20)).encode(), "chat")
    assert ok.body["tools"][0]["x"] == int("9" * 20)
    assert parse_inference_request((base % ("-" + "9" * 20)).encode(), "chat").body["tools"][0]["x"] == -int("9" * 20)
    with pytest.raises(GatewayError) as exc:
        parse_inference_request((base % ("1" + "0" * 20)).encode(), "chat")
    assert exc.value.code == "number_too_long"
    seed = parse_inference_request(b'{"model":"m","prompt":"x","seed":18446744073709551615}', "completions")
    assert seed.body["seed"] == (1 << 64) - 1


def test_long_digit_runs_inside_strings_are_text() -> None:
    digits = "1234567890" * 500
    req = parse_inference_request(_chat(digits), "chat")
    assert req.text.count("1234567890") == 500
    req = parse_inference_request(b'{"model":"m","prompt":"%s","zz":{"k%s":1.%s}}'
                                  % ((digits.encode(),) * 3), "completions", unknown_fields="drop")  # s23
    assert req.prompts == (digits,)


_numbers = st.one_of(
    st.integers(min_value=-(10 ** 20) + 1, max_value=10 ** 20 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.builds(lambda m, e: f"{m}e{e}", st.integers(-10 ** 19, 10 ** 19), st.integers(-300, 300)),
    st.builds(lambda m, f, e: f"{m}.{f}E{e:+d}", st.integers(-99999, 99999), st.integers(0, 10 ** 25),
              st.integers(-30, 30)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_numbers, min_size=1, max_size=8), st.text(alphabet="0123456789", max_size=40))
def test_ordinary_numbers_parse_identically(nums, digits) -> None:
    text = "[" + ",".join(n if isinstance(n, str) else json.dumps(n) for n in nums) + ', "%s"]' % digits
    raw = text.encode()
    want = json.loads(text)
    got, _ = json_fast.loads_checked(raw, text, max_int_digits=MAX_INT_DIGITS)
    assert json.dumps(got) == json.dumps(want)
    assert [type(x) for x in got] == [type(x) for x in want]
