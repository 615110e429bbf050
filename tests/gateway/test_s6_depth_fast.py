"""Session 6 (issue 14): :func:`gateway.request.parse_inference_request` skips the nesting walk when
the body holds at most ``max_depth`` brackets. Property: such a body never nests deeper (brackets in
strings only add to the count), and a body whose forwarded free-form field (``response_format``) nests
deeper is still refused with ``invalid_json`` (dropped fields are not walked: R6-1)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError
from gateway.request import parse_inference_request

LEAVES = st.one_of(st.none(), st.integers(-1000, 1000), st.text(alphabet="[]{}ab\"\\", max_size=4))
JSON = st.recursive(LEAVES, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                    st.dictionaries(st.text(alphabet="[{a", max_size=2), inner,
                                                                    max_size=3)), max_leaves=12)


def _depth(value: Any) -> int:
    """Reference nesting depth of a JSON value (a scalar is 0, ``{}`` and ``[]`` are 1)."""
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    return 0


@settings(max_examples=500, deadline=None)
@given(extra=JSON, limit=st.integers(1, 8))
def test_skipping_the_walk_never_accepts_a_deeper_body(extra: Any, limit: int) -> None:
    doc = {"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"x": extra}}
    raw = json.dumps(doc).encode()
    if raw.count(b"[") + raw.count(b"{") <= limit:
        assert _depth(doc) <= limit
    forwarded_depth = 1 + _depth(doc["response_format"])  # messages: bounded by the schema, not walked
    try:
        parse_inference_request(raw, "chat", limit)
        refused = False
    except GatewayError as err:
        assert err.code == "invalid_json"
        refused = True
    assert refused == (forwarded_depth > limit)


def test_a_deep_body_is_still_refused() -> None:
    raw = (b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"x": '
           + b"[" * 40 + b"]" * 40 + b"}}")
    with pytest.raises(GatewayError) as err:
        parse_inference_request(raw, "chat", 32)
    assert err.value.code == "invalid_json"
