"""Session 8, issue 14: the fast path of the head scan (:func:`gateway.upgrade_guard.whole_head_is_plain`)
never lets through a head that :class:`gateway.upgrade_guard.HeadScan` refuses, and the ``body`` it
reports (a head and its body's start then go to httptools in one parse) holds only for heads that
both parsers read as having a body. Hypothesis over heads built from risky pieces, then real
pipelined bytes over both parsers (tests/hostile/test_s7_upgrade_refused.py covers the refusals)."""

from __future__ import annotations

import h11
import httptools
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.upgrade_guard import HeadScan, whole_head_is_plain

_targets = st.sampled_from([b"/v1/completions", b"/a#b", b"/#", b"/x?q=#", b"/%23", b"*", b"/ok"])
_names = st.sampled_from([b"Host", b"Upgrade", b"upgrade", b"UPGRADE ", b"X-Upgrade", b"Content-Length",
                          b"content-length", b"CONTENT-LENGTH", b"Transfer-Encoding", b"Connection", b"Upgraded"])
_values = st.sampled_from([b"x", b"0", b"00", b"12", b" 7 ", b"1 2", b"chunked", b"h2c", b"#frag", b"upgrade: x", b""])
_fields = st.lists(st.tuples(_names, _values, st.sampled_from([b":", b" :", b":\t"])), max_size=5)


def _head(method: bytes, target: bytes, fields: list[tuple[bytes, bytes, bytes]], eol: bytes) -> bytes:
    lines = [method + b" " + target + b" HTTP/1.1"] + [n + c + v for n, v, c in fields]
    return eol.join(lines) + eol + eol


@settings(max_examples=1500, deadline=None)
@given(st.sampled_from([b"GET", b"POST", b"G#T"]), _targets, _fields, st.sampled_from([b"\r\n", b"\n"]))
def test_plain_heads_are_those_the_scan_lets_through(method: bytes, target: bytes,
                                                      fields: list[tuple[bytes, bytes, bytes]], eol: bytes) -> None:
    head = _head(method, target, fields, eol)
    plain, body = whole_head_is_plain(head)
    if plain:
        assert HeadScan().feed(head) is None
    else:
        assert not body
    if body:  # exactly one digits Content-Length, not zero, no Transfer-Encoding
        lengths = [v for n, v, c in fields if n.lower() == b"content-length" and c.startswith(b":")]
        assert len(lengths) == 1 and int(lengths[0]) > 0
        assert not any(n.lower().startswith(b"transfer-encoding") for n, _, _ in fields)


@settings(max_examples=500, deadline=None)
@given(_fields)
def test_a_body_head_is_read_with_a_body_by_h11(fields: list[tuple[bytes, bytes, bytes]]) -> None:
    head = _head(b"POST", b"/v1/completions", [(b"Host", b"x", b":"), *fields], b"\r\n")
    plain, body = whole_head_is_plain(head)
    if not body:
        return
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(head + b"z")
    try:
        event = conn.next_event()
    except h11.RemoteProtocolError:
        return  # refused: nothing after the head is parsed
    assert isinstance(event, h11.Request)
    assert isinstance(conn.next_event(), h11.Data)  # the byte after the head is body, not a new request


@settings(max_examples=500, deadline=None)
@given(_fields)
def test_a_body_head_is_read_with_a_body_by_httptools(fields: list[tuple[bytes, bytes, bytes]]) -> None:
    head = _head(b"POST", b"/v1/completions", [(b"Host", b"x", b":"), *fields], b"\r\n")
    if not whole_head_is_plain(head)[1]:
        return
    seen: list[str] = []

    class Callbacks:
        def on_message_begin(self) -> None:
            seen.append("begin")

        def on_body(self, body: bytes) -> None:
            seen.append("body")

    try:
        httptools.HttpRequestParser(Callbacks()).feed_data(head + b"z")
    except httptools.HttpParserError:
        return  # refused: nothing after the head is served
    assert seen == ["begin", "body"]


def test_bodiless_heads_are_not_body_heads() -> None:
    assert whole_head_is_plain(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n") == (True, False)
    assert whole_head_is_plain(b"POST / HTTP/1.1\r\nContent-Length: 0\r\n\r\n") == (True, False)
    assert whole_head_is_plain(b"POST / HTTP/1.1\r\nContent-Length: 000\r\n\r\n") == (True, False)
    assert whole_head_is_plain(b"POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n") == (True, True)
    assert whole_head_is_plain(b"POST /a#b HTTP/1.1\r\nContent-Length: 5\r\n\r\n") == (False, False)
