"""Session 22, S21-fixnew-2: a number literal that overflows a double (``1e400``, ``-1.8e308``, 400
digits and ``.0``) is not representable: 400 ``invalid_json`` "number out of range", wherever it is
and whichever parse path read the body (orjson refuses it; :mod:`json`'s ``parse_float`` now does too).
Before, the :mod:`json` fallback read it as ``inf``: "temperature: Input should be less than or equal
to 2", or 200 in a free-form place. Ordinary bodies (finite floats, underflows, the largest double)
parse exactly as before on every path (property test against :func:`json.loads`)."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.json_fast import NonFiniteLiteral, NumberOutOfRange, loads_checked
from gateway.request import MAX_INT_DIGITS, parse_inference_request
from tests.gateway.test_s21_nonfinite_json import (PATH_BODIES, PLACES, _SENTINEL, _holding_sentinel, _scalars,
                                                   _text, _values)

OUT_OF_RANGE = ["1e400", "-1e400", "1.8e308", "2E+308", "-" + "9" * 400 + ".5", "1" * 310 + "e0"]
# finite at the edges: the largest double, underflows (read as 0.0 or a subnormal by both parsers)
EDGES = ["1.7976931348623157e308", "-1.7976931348623157e308", "1e-400", "-1e-400", "5e-324", "-0.0", "1E+308",
         "0." + "0" * 400 + "1", "1" * 300 + ".0"]


def _strict(raw: bytes) -> tuple[Any, bool]:
    return loads_checked(raw, raw.decode(), max_int_digits=MAX_INT_DIGITS, max_depth=32, strict_numbers=True)


@settings(max_examples=300, deadline=None)
@given(st.tuples(st.dictionaries(_text, _values(_scalars), max_size=4), _text, _holding_sentinel())
       .map(lambda t: {**t[0], t[1]: t[2]}), st.sampled_from(OUT_OF_RANGE), st.booleans())
def test_an_overflowing_number_is_refused_on_every_parse_path(doc: dict[str, Any], literal: str,
                                                             ascii_only: bool) -> None:
    raw = json.dumps(doc, ensure_ascii=ascii_only).replace(json.dumps(_SENTINEL), literal).encode()
    with pytest.raises(NumberOutOfRange):
        _strict(raw)
    with pytest.raises(NumberOutOfRange):
        loads_checked(raw, strict_numbers=True)
    assert float("inf") in map(abs, _floats(loads_checked(raw)[0]))  # default (not strict): json's inf, as before


def _floats(value: Any) -> list[float]:
    if isinstance(value, float):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return [f for v in items for f in _floats(v)]


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_text, _values(st.one_of(_scalars, st.sampled_from(EDGES).map(float))), max_size=5),
       st.booleans())
def test_finite_numbers_parse_exactly_as_before(doc: dict[str, Any], ascii_only: bool) -> None:
    raw = json.dumps(doc, ensure_ascii=ascii_only).encode()
    strict = _strict(raw)
    assert strict == loads_checked(raw, raw.decode(), max_int_digits=MAX_INT_DIGITS, max_depth=32)
    assert json.dumps(strict[0]) == json.dumps(json.loads(raw))


@pytest.mark.parametrize("literal", EDGES)
@pytest.mark.parametrize("name", list(PATH_BODIES))
def test_edge_literals_read_as_json_reads_them_on_each_path(name: str, literal: str) -> None:
    raw = PATH_BODIES[name].replace(b"%s", literal.encode())
    value, _ = _strict(raw)
    assert repr(value["b"]) == repr(json.loads(raw)["b"])  # orjson or json, as before


@pytest.mark.parametrize("literal", OUT_OF_RANGE)
@pytest.mark.parametrize("name", list(PATH_BODIES))
def test_each_json_call_refuses_an_overflow(name: str, literal: str) -> None:
    raw = PATH_BODIES[name].replace(b"%s", literal.encode())
    with pytest.raises(NumberOutOfRange) as err:
        _strict(raw)
    assert isinstance(err.value, NonFiniteLiteral) and err.value.literal == literal[:32]


@pytest.mark.parametrize(("endpoint", "template"), PLACES)
def test_the_request_answers_invalid_json_number_out_of_range(endpoint: str, template: bytes) -> None:
    with pytest.raises(GatewayError) as err:
        parse_inference_request(template % b"1e400", endpoint, max_depth=64)
    assert (err.value.status, err.value.code) == (400, "invalid_json")
    assert err.value.message == "request body is not valid JSON: number out of range: 1e400 overflows a double (RFC 8259 §6)"
    # the same text inside a string is text
    body = template.replace(b"%s", b'"%s"') % b"1e400"
    if b"temperature" not in body and b"top_p" not in body and b"logit_bias" not in body:  # typed (s23: logit_bias)
        parse_inference_request(body, endpoint, max_depth=64, unknown_fields="drop")  # s23: "unknown" refused else
