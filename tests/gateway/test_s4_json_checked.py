"""Session 4 (issue 14): ``json_fast.loads_checked`` gives ``loads``'s value, and a document it
marks checked (orjson read it) holds nothing :func:`gateway.request._unforwardable` refuses, so
the request parser may skip that walk; an unchecked one still gets it (parse refuses as before)."""
from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.json_fast import loads, loads_checked
from gateway.request import _unforwardable, parse_inference_request

_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
                     st.text())
_values = st.recursive(_scalars, lambda c: st.one_of(st.lists(c, max_size=4),
                                                      st.dictionaries(st.text(max_size=8), c, max_size=4)),
                       max_leaves=30)


@settings(max_examples=500, deadline=None)
@given(_values, st.booleans())
def test_checked_documents_need_no_unforwardable_walk(value: Any, ascii_only: bool) -> None:
    data = json.dumps(value, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")
    try:
        want = loads(data)
    except Exception:  # noqa: BLE001 - then loads_checked raises too
        with pytest.raises(Exception):
            loads_checked(data)
        return
    got, checked = loads_checked(data)
    assert json.dumps(got) == json.dumps(want)
    if checked:
        assert _unforwardable(got) is None


@pytest.mark.parametrize(("tool", "code"), [('{"x": NaN}', "invalid_json"),  # S21-newcomer-5: not JSON
                                           ('{"x": 1e999}', "invalid_json"),  # S21-fixnew-2: out of range
                                           ('{"x": "\\ud800"}', "invalid_request"),
                                           ('{"\\udfff": 1}', "invalid_request")])
def test_parse_still_refuses_what_only_json_reads(tool: str, code: str) -> None:
    raw = ('{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [' + tool + "]}").encode()
    with pytest.raises(GatewayError) as err:
        parse_inference_request(raw, "chat")
    assert err.value.code == code
