"""Session 21, S21-newcomer-5: a ``NaN``, ``Infinity`` or ``-Infinity`` token anywhere in a request body
is not JSON (RFC 8259 §6) and answers 400 ``invalid_json``, whatever field holds it (bounded, free-form,
unknown) and whichever parse path read the body (orjson refuses the token; :mod:`json` with a Python
``parse_int`` per integer, or without); the same words inside a string are text and stay accepted.
Before the fix the :mod:`json` fallback read them: a misleading "temperature: should be <= 2", or 200."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.json_fast import NonFiniteLiteral, loads_checked
from gateway.request import MAX_INT_DIGITS, parse_inference_request

TOKENS = ["NaN", "Infinity", "-Infinity"]
_SENTINEL = "sentinel-7f3a9c"
# text that holds the tokens (legal inside a string) and long digit runs (they send a body to json's paths)
_text = st.one_of(st.text(max_size=8), st.sampled_from(TOKENS + ["x NaN y", "-Infinity!", "1" * 25, "9" * 19]))
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**19, 10**20 - 1),
                     st.floats(allow_nan=False, allow_infinity=False), _text)


def _values(leaf: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.recursive(leaf, lambda c: st.one_of(st.lists(c, max_size=4), st.dictionaries(_text, c, max_size=4)),
                        max_leaves=20)


def _holding_sentinel() -> st.SearchStrategy[Any]:
    """A value with the sentinel string at one random place (in a list between others, or an object's value)."""
    def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        in_list = st.tuples(st.lists(_values(_scalars), max_size=2), inner, st.lists(_values(_scalars), max_size=2))
        in_dict = st.tuples(st.dictionaries(_text, _values(_scalars), max_size=3), _text, inner)
        return st.one_of(in_list.map(lambda t: [*t[0], t[1], *t[2]]), in_dict.map(lambda t: {**t[0], t[1]: t[2]}))
    return st.recursive(st.just(_SENTINEL), extend, max_leaves=4)


@settings(max_examples=400, deadline=None)
@given(st.tuples(st.dictionaries(_text, _values(_scalars), max_size=4), _text, _holding_sentinel())
       .map(lambda t: {**t[0], t[1]: t[2]}), st.sampled_from(TOKENS), st.booleans())
def test_a_token_outside_strings_is_refused_on_every_parse_path(doc: dict[str, Any], token: str,
                                                               ascii_only: bool) -> None:
    raw = json.dumps(doc, ensure_ascii=ascii_only).replace(json.dumps(_SENTINEL), token).encode()
    with pytest.raises(NonFiniteLiteral):
        loads_checked(raw, raw.decode(), max_int_digits=MAX_INT_DIGITS, max_depth=32, strict_numbers=True)
    with pytest.raises(NonFiniteLiteral):
        loads_checked(raw, strict_numbers=True)
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"x":' + raw + b"}"
    with pytest.raises(GatewayError) as err:
        parse_inference_request(body, "chat", max_depth=64)
    assert (err.value.status, err.value.code) == (400, "invalid_json")
    assert token in err.value.message and "RFC 8259" in err.value.message


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_text, _values(_scalars), max_size=5), st.booleans())
def test_without_the_token_the_value_is_unchanged(doc: dict[str, Any], ascii_only: bool) -> None:
    raw = json.dumps(doc, ensure_ascii=ascii_only).encode()
    strict = loads_checked(raw, raw.decode(), max_int_digits=MAX_INT_DIGITS, max_depth=32, strict_numbers=True)
    assert strict == loads_checked(raw, raw.decode(), max_int_digits=MAX_INT_DIGITS, max_depth=32)
    assert json.dumps(strict[0]) == json.dumps(json.loads(raw))


PLACES = [
    ("completions", b'{"model":"sim-model","prompt":"x","temperature":%s}'),
    ("completions", b'{"model":"sim-model","prompt":"x","logit_bias":{"1":%s}}'),
    ("completions", b'{"model":"sim-model","prompt":"x","unknown":[1,{"a":%s}]}'),
    ("chat", b'{"model":"sim-model","messages":[{"role":"user","content":"x","extra":%s}]}'),
    ("chat", b'{"model":"sim-model","messages":[{"role":"user","content":"x"}],"logit_bias":{"7":%s}}'),
    ("chat", b'{"model":"sim-model","messages":[{"role":"user","content":"x"}],'
             b'"tools":[{"type":"function","function":{"name":"f","parameters":{"x":%s}}}]}'),
    ("completions", b'{"model":"sim-model","prompt":"x 1234567890123456789012","top_p":%s}'),  # a long digit run
]


@pytest.mark.parametrize("token", TOKENS)
@pytest.mark.parametrize(("endpoint", "template"), PLACES)
async def test_public_listener_answers_invalid_json_and_audits_it(stack: Any, monkeypatch: Any, endpoint: str,
                                                                   template: bytes, token: str) -> None:
    records: list[Any] = []
    emit = stack.components.audit.emit_request
    monkeypatch.setattr(stack.components.audit, "emit_request", lambda rec: (records.append(rec), emit(rec)))
    path = "/v1/chat/completions" if endpoint == "chat" else "/v1/completions"
    raw = template % token.encode()
    r = await stack.client.post(path, content=raw, headers={**stack.auth(), "content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_json" and err["param"] is None
    assert f"{token} is not a JSON value" in err["message"]
    assert [(rec.status, rec.error_code) for rec in records] == [(400, "invalid_json")]
    # the same words as text are accepted
    ok = template.replace(b"%s", b'"%s"') % token.encode()
    if b"temperature" in ok or b"top_p" in ok or b"logit_bias" in ok:
        return  # typed fields (logit_bias since session 23): a string there is a schema error, not this rule
    if b'"unknown"' in ok:  # session 23: a top-level field outside the schema is refused by default
        r = await stack.client.post(path, content=ok, headers={**stack.auth(), "content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "unsupported_parameter", r.text
        return
    r = await stack.client.post(path, content=ok, headers={**stack.auth(), "content-type": "application/json"})
    assert r.status_code == 200, r.text


_QUOTES = b",".join(b'"k%c":"v"' % (97 + i % 26) for i in range(40))  # > 4 quotes per digit: no split
PATH_BODIES = {  # json's three calls in loads_checked, each with the token last
    "json": b'{"a":1,"b":%s}',
    "json after the split of a long digit run": b'{"a":"1234567890123456789012345","b":%s}',
    "json with parse_int per integer": b'{"a":"1234567890123456789012345",' + _QUOTES + b',"b":%s}',
}


@pytest.mark.parametrize("token", TOKENS)
@pytest.mark.parametrize("name", list(PATH_BODIES))
def test_each_json_call_refuses_the_token(monkeypatch: Any, name: str, token: str) -> None:
    import gateway.json_fast as json_fast
    calls: list[list[str]] = []
    real = json.loads
    monkeypatch.setattr(json_fast.json, "loads", lambda s, **kw: (calls.append(sorted(kw)), real(s, **kw))[1])
    raw = PATH_BODIES[name].replace(b"%s", token.encode())
    with pytest.raises(NonFiniteLiteral):
        loads_checked(raw, raw.decode(), max_int_digits=MAX_INT_DIGITS, max_depth=32, strict_numbers=True)
    # session 22 (S21-fixnew-2): each call also refuses a float beyond a double (parse_float)
    assert calls == [["parse_constant", "parse_float", "parse_int"] if "parse_int" in name
                     else ["parse_constant", "parse_float"]]
    assert loads_checked(raw, raw.decode(), max_int_digits=MAX_INT_DIGITS, max_depth=32)[0]["b"] != 0  # default: read
