"""gateway.json_fast.loads answers exactly as json.loads (value or error) for any input."""
from __future__ import annotations

import json
import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.json_fast import loads

_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                     st.text())
_values = st.recursive(_scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), c, max_size=4)),
                       max_leaves=30)


def _outcome(f: Any, data: str | bytes) -> tuple[str, Any]:
    try:
        return "value", _canon(f(data))
    except Exception as exc:  # noqa: BLE001 - the very point: the same error
        return "error", (type(exc), str(exc))


def _canon(v: Any) -> Any:
    """A comparable form: NaN equal to NaN, float and int kept apart, key order kept."""
    if isinstance(v, float):
        return ("float", "nan" if math.isnan(v) else v.hex())
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return ("int", v)
    if isinstance(v, list):
        return [_canon(x) for x in v]
    if isinstance(v, dict):
        return [(k, _canon(x)) for k, x in v.items()]
    return v


@settings(max_examples=400, deadline=None)
@given(_values, st.booleans())
def test_documents_json_writes(value: Any, ascii_only: bool) -> None:
    data = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    assert _outcome(loads, data) == _outcome(json.loads, data)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.sampled_from(list('{}[]":,0123456789.eE+-tfnalsruNIiy \t\n\r\\u\x00\x1f\ufeff\ud800é')),
               max_size=40))
def test_arbitrary_text(text: str) -> None:
    raw = text.encode("utf-8", "surrogatepass")
    assert _outcome(loads, raw) == _outcome(json.loads, raw)
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return
    # the request parser's form: bytes plus their UTF-8 text, answering as json.loads(text)
    assert _outcome(lambda d: loads(d, text), raw) == _outcome(json.loads, text)


def test_named_cases() -> None:
    for text in ['{"a":1,"a":2}', "1e400", "-1e400", "NaN", "[Infinity]", '"\\ud800"', "\ufeff{}", " {} ",
                 '{"a":"\x01"}', "-0", "-0.0", "1E2", "1" * 40, "-9999999999999999999", "18446744073709551616", "9223372036854775807", "[1.5e308, 5e-324]", '{"a":1}\x0c', '"\u2028"', "[" * 300 + "]" * 300, "\x00{}", "{\"a\": \"\x00\"}",
                 "[" * 5000 + "]" * 5000, '{"a": [1, 2, {"b": null}]}', "", "nul", "[1,]", "01"]:
        data = text.encode("utf-8", "surrogatepass")
        assert _outcome(loads, data) == _outcome(json.loads, data), repr(text)[:60]
        if "\ud800" not in text:
            assert _outcome(lambda d: loads(d, text), data) == _outcome(json.loads, text), repr(text)[:60]
    for enc in ("utf-16", "utf-32", "utf-16-le"):
        data = '{"a": [1, "é"]}'.encode(enc)
        assert _outcome(loads, data) == _outcome(json.loads, data), enc
