"""Session 15 (issue 14): ``head_key_fields`` answers a plain in-range int inline and asks ``_count`` for
anything else; the result must be the one the session-14 version gave for every fact (a hit never skips a
validation ``build_policy_input`` would make: a mistyped or out-of-range fact gives ``None``)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from policy.cache import _count, _is_mapping, head_key_fields


def _before(sid: Any, td: Any, claims: Any, endpoint: Any, model: Any, pt: Any, mt: Any, stream: Any,
            seq: Any, q: Any) -> tuple[Any, ...] | None:
    """The session-14 function, kept here as the reference."""
    if not (isinstance(sid, str) and sid and isinstance(td, str) and td and _is_mapping(claims)
            and isinstance(endpoint, str) and endpoint and isinstance(model, str) and model
            and isinstance(stream, bool) and (pt is None or _count(pt, 0))
            and (mt is None or _count(mt, 0)) and _count(seq, 1) and _count(q, 0)):
        return None
    return (sid, td, endpoint, model)


class _Int(int):
    """An int subclass: not ``type(x) is int``, so it takes the ``_count`` path."""


counts = st.one_of(st.integers(-3, 3), st.none(), st.booleans(), st.floats(-1, 3), st.just("1"),
                   st.integers(-3, 3).map(_Int), st.just(2**70))
claims = st.sampled_from([{}, {"aud": ["x"]}, MappingProxyType({"a": 1}), [], None, "c"])


@settings(max_examples=600, deadline=None)
@given(sid=st.sampled_from(["spiffe://t/a", "", 5]), td=st.sampled_from(["t", ""]), claims=claims,
       endpoint=st.sampled_from(["/v1/completions", ""]), model=st.sampled_from(["m", "", None]),
       pt=counts, mt=counts, stream=st.sampled_from([True, False, 0, None]), seq=counts, q=counts)
def test_inline_checks_give_the_session_14_answer(sid: Any, td: Any, claims: Any, endpoint: Any, model: Any,
                                                  pt: Any, mt: Any, stream: Any, seq: Any, q: Any) -> None:
    args = (sid, td, claims, endpoint, model, pt, mt, stream, seq, q)
    assert head_key_fields(*args) == _before(*args)


def test_a_bool_or_negative_count_is_refused() -> None:
    ok = ("spiffe://t/a", "t", {}, "/v1/completions", "m")
    assert head_key_fields(*ok, 3, 4, False, 1, 0) == ("spiffe://t/a", "t", "/v1/completions", "m")
    assert head_key_fields(*ok, True, 4, False, 1, 0) is None  # a bool is not a count
    assert head_key_fields(*ok, 3, -1, False, 1, 0) is None
    assert head_key_fields(*ok, 3, 4, False, 0, 0) is None  # at least one sequence
    assert head_key_fields(*ok, 3, 4, False, 1, -1) is None
