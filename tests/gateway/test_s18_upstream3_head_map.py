"""Session 18 (upstream3): the answer head's field map (gateway/upstream_conn.py ``_header_map``) against
the rule written out field by field, for any fields (a one-pass decoding was tried against this and
measured slower: docs/benchmarks.md, "Session 18: upstream3"); and the request is written before its
answer's state is set (``UpstreamConnection.send``)."""

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


def _flat(pairs: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return list(pairs)


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
def test_the_size_bound_is_exact(extra: int) -> None:
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


async def test_send_writes_first_and_the_answer_is_read_whole() -> None:
    import asyncio

    from gateway.upstream_conn import UpstreamConnection

    written: list[bytes] = []
    idled: list[object] = []

    class _T:
        def write(self, data: bytes) -> None:
            written.append(data)

        def is_closing(self) -> bool:
            return False

        def abort(self) -> None:
            pass

        def get_extra_info(self, name: str, default: object = None) -> object:
            return default

        def get_write_buffer_size(self) -> int:
            return 0

    conn = UpstreamConnection(idled.append, lambda c: None, asyncio.get_running_loop())
    conn.connection_made(_T())  # type: ignore[arg-type]
    for i in range(2):  # the second answer on the same (kept-alive) connection: its state was reset
        resp = conn.send(b"POST / HTTP/1.1\r\n\r\n", f"r{i}")
        assert written[-1] == b"POST / HTTP/1.1\r\n\r\n"
        conn.data_received(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Request-Id: r%d\r\n\r\nok" % i)
        await resp.wait_head()
        assert resp.status == 200 and resp.headers["x-request-id"] == f"r{i}"
        assert await resp.read_chunk() == b"ok" and await resp.read_chunk() == b""
        assert idled[-1] is conn and len(idled) == i + 1
    resp = conn.send(b"x", "r9")
    with pytest.raises(RuntimeError):
        conn.send(b"y")  # busy: refused, nothing written
    assert written[-1] == b"x"
    resp.close()
