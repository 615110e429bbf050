"""Review findings: a lone surrogate in any forwarded field (``stop``, tools, …) and
non-finite numbers are refused with a 400 at parse time, never a 500 after
admission, and never forwarded as ``null``."""

from __future__ import annotations

import pytest

from gateway.errors import GatewayError
from gateway.request import parse_inference_request

SURROGATE_BODIES = [
    ("completions", b'{"model":"m","max_tokens":2,"prompt":"hi","stop":"\\ud800"}'),
    ("completions", b'{"model":"m","max_tokens":2,"prompt":"hi","stop":["ok","\\udfff"]}'),
    ("completions", b'{"model":"m","max_tokens":2,"prompt":"hi","stream":true,"stop":"\\ud800"}'),
    ("chat", b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stop":"\\ud800"}'),
    ("chat", b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
             b'"tools":[{"type":"function","function":{"name":"f","parameters":{"\\ud800":1}}}]}'),
]


@pytest.mark.parametrize(("endpoint", "raw"), SURROGATE_BODIES)
def test_lone_surrogate_anywhere_is_a_400(endpoint: str, raw: bytes) -> None:
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(raw, endpoint)  # type: ignore[arg-type]
    assert exc.value.status == 400 and exc.value.code == "invalid_request"


@pytest.mark.parametrize(("number", "code"), [(b"NaN", "invalid_json"), (b"Infinity", "invalid_json"),
                                              (b"-Infinity", "invalid_json"),  # S21-newcomer-5: not JSON
                                              (b"1e999", "invalid_json"), (b"-1e400", "invalid_json")])  # S21-fixnew-2
def test_non_finite_numbers_are_a_400(number: bytes, code: str) -> None:
    raw = (b'{"model":"m","messages":[{"role":"user","content":"hi"}],'
           b'"tools":[{"type":"function","function":{"name":"f","parameters":{"x":' + number + b'}}}]}')
    with pytest.raises(GatewayError) as exc:
        parse_inference_request(raw, "chat")
    assert exc.value.status == 400 and exc.value.code == code


def test_valid_unicode_and_large_finite_numbers_pass() -> None:
    raw = ('{"model":"m","max_tokens":2,"prompt":"h\u00e9llo \U0001f600","stop":"\u00e9",'
           '"temperature":0.5,"logit_bias":{"1":100},"x_engine_field":1e300}').encode()
    req = parse_inference_request(raw, "completions", unknown_fields="drop")  # session 23: x_engine_field dropped
    assert req.body["stop"] == "\u00e9"
