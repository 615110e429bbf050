"""Review R8-1 (request smuggling through ``CONNECT``) and R8-5 (``#`` target pipelined behind a body).

Before the fix, under the default httptools parser, ``CONNECT /v1/chat/completions HTTP/1.1`` with a
``Content-Length`` body had its body parsed as a NEW request on the same connection (llhttp treats any
CONNECT as an upgrade; the R7-1 guard skipped CONNECT): one request sent, two answered (public:
405 then the smuggled 200; admin: 401 then the smuggled operator request). Now, under BOTH parsers and
on BOTH listeners, any ``CONNECT`` head is answered 400 ``method_not_supported`` with
``Connection: close`` before a parser completes it, nothing reaches the app, the refusal is audited
once (endpoint ``http_guard``); in one write, with the body in a later write, with the method split
across writes, and pipelined behind a bodiless request or a request with a body (answers in order,
the refusal last). The reviewer's framing sweep (review8-scripts/smuggle_sweep.py) runs as a
parametrized test: one request in, at most one answer, the request hidden in its body never served.
R8-5: a ``#`` target pipelined behind a request with a body (or, under h11, any request) is refused
by the backstops as a scanned one is. The ``byte_by_byte_head`` case also shows the refused head's
connection closes *lingering* (what the client still sends is discarded, the 400 stays readable):
before this session the guarded classes' own ``guard_body_unfinished`` shadowed the mixin's, so a
head refused before it was complete closed at once and the client's next write reset the connection.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.upgrade_guard import CONNECT_CODE, TARGET_CODE, HeadScan
from tests.hostile.test_i10_header_limits import LISTENERS, PARSERS, _parse_responses  # noqa: F401
from tests.hostile.test_i10_header_limits import config_overrides  # noqa: F401 - fixture
from tests.hostile.test_s7_upgrade_refused import (  # noqa: F401 - start: fixture
    CHAT, INNER, assert_refused_once, exchange, guard_events, request, start)
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

parsers = pytest.mark.parametrize("parser", PARSERS)
listeners = pytest.mark.parametrize("which", LISTENERS)


#: the requests a pipelined head can follow in one read: no body, a Content-Length body, a chunked body
FRONTS = ("bodiless", "with_body", "chunked_body")


def front_request(first: str) -> bytes:
    """The bytes of one :data:`FRONTS` request to ``/healthz``."""
    if first == "bodiless":
        return request("GET", "/healthz", {})
    if first == "with_body":
        return request("POST", "/healthz", {}, b"{}")
    return b"POST /healthz HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"


def _inner(stack: Any, which: str) -> bytes:
    """A complete request the listener's app would serve (with credentials) and a proxy-chosen XFF."""
    auth = stack.auth("tenant-a/app") if which == "public" else {}
    method, path = INNER[which]
    return request(method, path, {**auth, "X-Forwarded-For": "6.6.6.6"},
                   json.dumps(CHAT).encode() if method == "POST" else b"")


def connect_smuggle(stack: Any, which: str) -> bytes:
    """The review's case: ``CONNECT <origin-form>`` without credentials, its body a complete request."""
    inner = _inner(stack, which)
    return (f"CONNECT {INNER['public'][1]} HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {len(inner)}\r\n\r\n").encode() + inner


@parsers
@listeners
@pytest.mark.parametrize("split", ["one_write", "body_later", "method_split", "byte_by_byte_head"])
async def test_connect_with_a_body_is_refused_before_any_parse(start: Any, stack: Any, audit_log: ListLog,
                                                              parser: str, which: str, split: str) -> None:
    lst = await start(parser, which)
    outer = connect_smuggle(stack, which)
    cut = outer.index(b"\r\n\r\n") + 4
    if split == "one_write":
        pieces = [outer]
    elif split == "body_later":
        pieces = [outer[:cut], outer[cut:]]
    elif split == "method_split":
        pieces = [outer[:4], outer[4:]]  # "CONN" | "ECT /v1/... "
    else:
        pieces = [bytes([b]) for b in outer[:12]] + [outer[12:]]
    data, closed = await exchange(lst.addr, pieces)
    assert_refused_once(data, closed, CONNECT_CODE)  # before R8-1 (httptools): [405, 200] / [401, 200]
    assert lst.reached == []  # neither the CONNECT nor the request in its body reached the app
    events = guard_events(audit_log)
    assert [(e.endpoint, e.status_code, e.error_code, e.outcome.value) for e in events] == [
        ("http_guard", 400, CONNECT_CODE, "rejected")]
    assert events[0].client_address == "127.0.0.1"


@parsers
@pytest.mark.parametrize("first", FRONTS)
async def test_connect_pipelined_in_the_same_write_is_not_smuggled(start: Any, stack: Any, audit_log: ListLog,
                                                                   parser: str, first: str) -> None:
    """A CONNECT head pipelined behind another request in the same read (the scan does not see it behind
    a body; h11 parses it from its own buffer): the backstops refuse it after the answers in progress."""
    lst = await start(parser, "public")
    front = front_request(first)
    data, closed = await exchange(lst.addr, [front + connect_smuggle(stack, "public")])
    responses = _parse_responses(data)
    assert closed
    assert lst.reached == ["/healthz"]  # the CONNECT and the request in its body never reached the app
    assert [r.status for r in responses] == [200 if first == "bodiless" else 405, 400]
    assert responses[-1].json()["error"]["code"] == CONNECT_CODE
    assert [e.error_code for e in guard_events(audit_log) if e.endpoint == "http_guard"] == [CONNECT_CODE]


@parsers
@pytest.mark.parametrize("first", ["bodiless", "with_body"])
async def test_fragment_pipelined_behind_a_request_is_refused(start: Any, stack: Any, audit_log: ListLog,
                                                              parser: str, first: str) -> None:
    """R8-5: before, httptools served ``/v1/models#frag`` behind a body ([200, 200]), h11 routed it (404)."""
    lst = await start(parser, "public")
    auth = stack.auth("tenant-a/app")
    front = request("GET", "/healthz", {}) if first == "bodiless" else request("POST", "/healthz", {}, b"{}")
    data, closed = await exchange(lst.addr, [front + request("GET", "/v1/models#frag", auth)])
    responses = _parse_responses(data)
    assert closed
    assert lst.reached == ["/healthz"]
    assert [r.status for r in responses] == [200 if first == "bodiless" else 405, 400]
    assert responses[-1].json()["error"]["code"] == TARGET_CODE
    assert [e.error_code for e in guard_events(audit_log) if e.endpoint == "http_guard"] == [TARGET_CODE]


def _sweep_cases(inner: str) -> dict[str, str]:
    """review8-scripts/smuggle_sweep.py's framings: ONE request whose body (by some reading) is ``inner``."""
    n = len(inner)
    ch = f"{n:x}\r\n{inner}\r\n0\r\n\r\n"
    h = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    return {
        "connect_cl": f"CONNECT /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n\r\n{inner}",
        "connect_chunked": f"CONNECT /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n{ch}",
        "connect_authority_cl": f"CONNECT gateway.test:443 HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n\r\n{inner}",
        "connect_absolute_cl": f"CONNECT http://x/v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n\r\n{inner}",
        "connect_no_body_then_request": f"CONNECT /v1/models HTTP/1.1\r\nHost: x\r\n\r\n{inner}",
        "connect_lower_case": f"connect /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n\r\n{inner}",
        "options_cl": f"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n\r\n{inner}",
        "dup_identical_cl": f"{h}Content-Length: {n}\r\nContent-Length: {n}\r\n\r\n{inner}",
        "cl_list": f"{h}Content-Length: {n}, {n}\r\n\r\n{inner}",
        "te_identity_then_chunked": f"{h}Transfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n\r\n{ch}",
        "te_chunked_cl0": f"{h}Transfer-Encoding: chunked\r\nContent-Length: 0\r\n\r\n{ch}",
        "te_xchunked": f"{h}Transfer-Encoding: xchunked\r\n\r\n{ch}",
        "te_padded": f"{h}Transfer-Encoding:  chunked \r\n\r\n{ch}",
        "http10_chunked": ("POST /v1/chat/completions HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n"
                           f"Transfer-Encoding: chunked\r\n\r\n{ch}"),
        "chunk_size_0x": f"{h}Transfer-Encoding: chunked\r\n\r\n0x{n:x}\r\n{inner}\r\n0\r\n\r\n",
        "chunk_ext": f"{h}Transfer-Encoding: chunked\r\n\r\n{n:x};a=\"x\"\r\n{inner}\r\n0\r\n\r\n",
        "chunk_size_space": f"{h}Transfer-Encoding: chunked\r\n\r\n{n:x} \r\n{inner}\r\n0\r\n\r\n",
        "chunk_line_bare_lf": f"{h}Transfer-Encoding: chunked\r\n\r\n{n:x}\n{inner}\r\n0\r\n\r\n",
        "expect_100": f"{h}Expect: 100-continue\r\nContent-Length: {n}\r\n\r\n{inner}",
        "get_cl": f"GET /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n\r\n{inner}",
        "head_cl": f"HEAD /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n\r\n{inner}",
        "connection_upgrade_only": f"{h}Connection: Upgrade\r\nContent-Length: {n}\r\n\r\n{inner}",
        "upgrade_h2c_cl": f"{h}Connection: Upgrade\r\nUpgrade: h2c\r\nContent-Length: {n}\r\n\r\n{inner}",
        "trace_cl": f"TRACE /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\n\r\n{inner}",
    }


SWEEP = list(_sweep_cases("").keys())


@parsers
@pytest.mark.parametrize("case", SWEEP)
async def test_framing_sweep_never_serves_the_request_in_a_body(start: Any, stack: Any, audit_log: ListLog,
                                                                parser: str, case: str) -> None:
    """One request in: at most one answer, and the credentialed ``GET /v1/models`` hidden in its body
    (the only request in the bytes that carries a token) never reaches the app."""
    lst = await start(parser, "public")
    token = stack.auth("tenant-a/app")["Authorization"]
    inner = f"GET /v1/models?smuggled=1 HTTP/1.1\r\nHost: x\r\nAuthorization: {token}\r\n\r\n"
    data, closed = await exchange(lst.addr, [_sweep_cases(inner)[case].encode()])
    statuses = [r.status for r in _parse_responses(data)] if data.startswith(b"HTTP/1.1 ") else []
    assert b'"object":"list"' not in data and b'"object": "list"' not in data, statuses  # the model list
    assert len(statuses) <= 1, statuses
    assert len(lst.reached) <= 1, lst.reached
    if case.startswith("connect_") and case != "connect_lower_case":
        assert statuses == [400] and lst.reached == [], statuses
        assert closed


@pytest.mark.parametrize("head,code", [
    (b"CONNECT /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n", CONNECT_CODE),
    (b"\r\nCONNECT gateway.test:443 HTTP/1.1\r\nHost: a\r\n\r\n", CONNECT_CODE),
    (b"CONNECT /a#b HTTP/1.1\r\n\r\n", CONNECT_CODE),
    (b"CONNECTX / HTTP/1.1\r\nHost: a\r\n\r\n", CONNECT_CODE),  # S9-L1: no standard method either
    (b"GET /CONNECT HTTP/1.1\r\nHost: a\r\nX: CONNECT / HTTP/1.1\r\n\r\n", None),
    (b"POST / HTTP/1.1\r\nHost: a\r\n\r\n", None),
])
def test_head_scan_finds_connect_at_every_split(head: bytes, code: str | None) -> None:
    for cut in range(len(head) + 1):
        for cut2 in (cut, min(len(head), cut + 1), min(len(head), cut + 3)):
            scan = HeadScan()
            found = scan.feed(head[:cut]) or scan.feed(head[cut:cut2]) or scan.feed(head[cut2:])
            assert found == code, (cut, cut2)
    scan = HeadScan()
    assert [c for b in head if (c := scan.feed(bytes([b])))][:1] == ([code] if code else [])
