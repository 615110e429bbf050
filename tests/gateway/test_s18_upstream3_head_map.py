"""Session 18 (upstream3): the answer head's fields are decoded in one pass (gateway/upstream_conn.py
``_header_map``): the same map and the same refusals as the field-by-field rule, for any fields."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.upstream_conn import MAX_HEAD_BYTES, UpstreamProtocolError, _header_map


def _reference(pairs: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The rule field by field (session 15's code): lower-case names, repeated names joined with ", ",
    a repeated Content-Length and a head over MAX_HEAD_BYTES refused."""
    headers: dict[str, str] = {}
    size = 0
    for name, value in pairs:
        size += len(name) + len(value) + 4
        key, val = name.decode("latin-1").lower(), value.decode("latin-1")
        if key not in headers:
            headers[key] = val
        elif key == "content-length":
            raise UpstreamProtocolError("repeated Content-Length")
        else:
            headers[key] = headers[key] + ", " + val
    if size > MAX_HEAD_BYTES:
        raise UpstreamProtocolError("too large")
    return headers


def _flat(pairs: list[tuple[bytes, bytes]]) -> list[bytes]:
    out: list[bytes] = []
    for name, value in pairs:
        out += [name, value]
    return out


_NAMES = st.sampled_from([b"Content-Type", b"content-type", b"X-Request-Id", b"Content-Length", b"Date",
                          b"X-\xc0\xdeK", b"Server", b"Set-Cookie", b"a\nb"])
_VALUES = st.binary(max_size=12) | st.sampled_from([b"", b"\n", b"a\nb", b"\xc0\xff", b"200"])


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=8))
def test_one_pass_gives_the_field_by_field_map(pairs: list[tuple[bytes, bytes]]) -> None:
    try:
        want: dict[str, str] | str = _reference(pairs)
    except UpstreamProtocolError:
        want = "refused"
    try:
        got: dict[str, str] | str = _header_map(_flat(pairs))
    except UpstreamProtocolError:
        got = "refused"
    assert got == want
    if isinstance(got, dict):
        assert list(got) == list(want)  # type: ignore[arg-type]  # the same order of names


@pytest.mark.parametrize("extra", [-1, 0, 1])
def test_the_size_bound_is_exact_on_the_one_pass(extra: int) -> None:
    # two distinct fields whose "name: value\r\n" lines sum to MAX_HEAD_BYTES + extra
    first = (b"A", b"x" * 10)
    rest = MAX_HEAD_BYTES + extra - (len(first[0]) + len(first[1]) + 4) - (1 + 4)
    pairs = [first, (b"B", b"y" * rest)]
    if extra > 0:
        with pytest.raises(UpstreamProtocolError, match="larger than"):
            _header_map(_flat(pairs))
    else:
        assert _header_map(_flat(pairs)) == {"a": "x" * 10, "b": "y" * rest}


def test_a_repeated_content_length_is_refused_and_other_names_joined() -> None:
    with pytest.raises(UpstreamProtocolError, match="repeated Content-Length"):
        _header_map(_flat([(b"Content-Length", b"1"), (b"content-length", b"1")]))
    assert _header_map(_flat([(b"Via", b"a"), (b"VIA", b"b")])) == {"via": "a, b"}
    assert _header_map([]) == {}
