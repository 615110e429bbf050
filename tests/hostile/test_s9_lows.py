"""Session 9 lows left open by session 8 (docs/security.md, "Session 9 lows").

- **Methods** (S9-L1): the gateway parses and routes only the standard methods (RFC 9110 section 9.3
  without ``CONNECT``, plus ``PATCH``, RFC 5789); any other method token (``connect`` or ``Connect``:
  methods are case-sensitive, so neither is ``CONNECT``; ``PRI``; lower-case ``get``; an extension
  method) is refused before a parser completes the head: 400 ``method_not_supported``,
  ``Connection: close``, audited once (``http_guard``), under both parsers. Before: httptools answered
  uvicorn's text 400 (``connect``) or routed the head (``PROPFIND``), h11 routed every one (405/404).
- **PRI** (S9-L2): ``PRI * HTTP/2.0`` (the HTTP/2 preface) got two answers under h11 (404, then 400
  for the preface's ``SM`` line); now one 400 and the close.
- **Field count of a pipelined head** (S9-L3): a head pipelined behind a request *body* in the same read
  (both parsers), and any pipelined head under h11, was bounded by ``max_header_bytes`` only; now by
  ``limits.max_header_fields`` as a first head: 431 ``too_many_header_fields`` after the answer in
  progress, the head never reaches the app.
- A pipelined head split over two reads behind a body is still served (the scan does not read the
  middle of a head as a request line).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gateway.app import build_admin_app, build_public_app
from gateway.protocol_audit import attach, refusals_of
from gateway.server import uvicorn_config
from gateway.upgrade_guard import CONNECT_CODE, HeadScan, whole_head_is_plain
from tests.hostile.test_i10_header_limits import PARSERS, Listener, _parse_responses, _recording
from tests.hostile.test_i10_header_limits import config_overrides  # noqa: F401 - fixture
from tests.hostile.test_s6_header_fields import head_with_fields
from tests.hostile.test_s7_upgrade_refused import CHAT, INNER, exchange, guard_events, request
from tests.hostile.test_s8_connect_refused import FRONTS, front_request
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from tests.support.listeners import serving

parsers = pytest.mark.parametrize("parser", PARSERS)
MAXF = 20
FIELDS_CODE = "too_many_header_fields"


@pytest.fixture
async def start(stack: Any) -> AsyncIterator[Callable[..., Awaitable[Listener]]]:
    """``await start(parser, which, **limit_updates)``: a fresh listener whose guard refusals are audited."""
    c = stack.components
    async with serving() as serve:
        async def _start(parser: str, which: str, **updates: Any) -> Listener:
            limits = c.config.limits.model_copy(update=updates)
            reached: list[str] = []
            app = build_public_app(c, manage_lifecycle=False) if which == "public" else build_admin_app(c)
            audited = attach(_recording(app, reached), refusals_of(app))
            addr = await serve(uvicorn_config(audited, "127.0.0.1", 0, http=parser, limits=limits))
            return Listener(addr, INNER[which][1], reached)

        yield _start


def _codes(log: ListLog) -> list[tuple[int, str]]:
    return [(e.status_code, e.error_code) for e in guard_events(log) if e.endpoint == "http_guard"]


def _smuggle(stack: Any, method: str) -> bytes:
    """``<method> /v1/chat/completions`` without credentials whose body is a complete credentialed request."""
    inner = request("POST", "/v1/chat/completions", {**stack.auth("tenant-a/app"), "X-Forwarded-For": "6.6.6.6"},
                    json.dumps(CHAT).encode())
    return (f"{method} /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(inner)}\r\n\r\n").encode() + inner


HEADS = {
    "connect_lower": lambda s: _smuggle(s, "connect"),
    "connect_mixed": lambda s: _smuggle(s, "Connect"),
    "get_lower": lambda s: b"get /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    "propfind": lambda s: b"PROPFIND /v1/models HTTP/1.1\r\nHost: x\r\n\r\n",
    "extension": lambda s: _smuggle(s, "FOO"),
    "pri_preface": lambda s: b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
}


@parsers
@pytest.mark.parametrize("which", ["public", "admin"])
@pytest.mark.parametrize("case", sorted(HEADS))
@pytest.mark.parametrize("split", ["one_write", "method_split"])
async def test_a_method_the_gateway_does_not_serve_is_refused_before_any_parse(
        start: Any, stack: Any, audit_log: ListLog, parser: str, which: str, case: str, split: str) -> None:
    lst = await start(parser, which)
    head = HEADS[case](stack)
    data, closed = await exchange(lst.addr, [head] if split == "one_write" else [head[:2], head[2:]])
    responses = _parse_responses(data)
    # before: httptools uvicorn's text 400 (connect, get, FOO, PRI) or 405 (PROPFIND); h11 405/404 (and for
    # PRI a second answer, 400, for the preface's "SM" line)
    assert [r.status for r in responses] == [400], [r.status for r in responses]
    assert responses[0].json()["error"]["code"] == CONNECT_CODE
    assert responses[0].headers["connection"] == ["close"]
    assert closed
    assert lst.reached == []  # neither the head nor a request in its body reached the app
    assert _codes(audit_log) == [(400, CONNECT_CODE)]


@parsers
@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "TRACE", "PATCH"])
async def test_the_standard_methods_still_reach_the_app(start: Any, audit_log: ListLog, parser: str,
                                                        method: str) -> None:
    lst = await start(parser, "public")
    data, _ = await exchange(lst.addr, [request(method, "/healthz", {"Connection": "close"})])
    statuses = [r.status for r in _parse_responses(data)] if method != "HEAD" else [int(data.split()[1])]
    assert statuses == [200 if method in ("GET", "HEAD") else 405]
    assert lst.reached == ["/healthz"]
    assert _codes(audit_log) == []


@parsers
@pytest.mark.parametrize("first", ["bodiless", "with_body"])
async def test_a_lower_case_connect_pipelined_behind_a_request_is_refused(
        start: Any, stack: Any, audit_log: ListLog, parser: str, first: str) -> None:
    """Pipelined in the same write (unscanned behind a body; under h11 parsed from its own buffer): the
    answer in progress completes, then one 400 and the close; the request in its body is never served."""
    lst = await start(parser, "public")
    front = request("GET", "/healthz", {}) if first == "bodiless" else request("POST", "/healthz", {}, b"{}")
    data, closed = await exchange(lst.addr, [front + _smuggle(stack, "connect")])
    responses = _parse_responses(data)
    assert closed
    assert lst.reached == ["/healthz"]
    assert [r.status for r in responses] == [200 if first == "bodiless" else 405, 400]
    # httptools refuses a lower-case method itself behind a body (uvicorn's parser error, deferred: the
    # guard's invalid_request); everywhere else the guard names it
    code = responses[-1].json()["error"]["code"]
    assert code == CONNECT_CODE or (parser, first, code) == ("httptools", "with_body", "invalid_request")
    assert _codes(audit_log) == [(400, code)]


@parsers
@pytest.mark.parametrize("first", FRONTS)
async def test_a_pipelined_head_is_bounded_by_the_field_count(start: Any, audit_log: ListLog, parser: str,
                                                             first: str) -> None:
    lst = await start(parser, "public", max_header_fields=MAXF)
    front = front_request(first)
    data, closed = await exchange(lst.addr, [front + head_with_fields("/healthz", MAXF * 10)])
    statuses = [r.status for r in _parse_responses(data)]
    assert closed
    assert lst.reached == ["/healthz"]  # before: twice (the 200-field head served) under h11, and behind a body
    assert statuses == [200 if first == "bodiless" else 405, 431], statuses
    assert _codes(audit_log) == [(431, FIELDS_CODE)]


@parsers
@pytest.mark.parametrize("first", ["bodiless", "with_body"])
@pytest.mark.parametrize("cut", [3, 9, 20, 40])
async def test_a_pipelined_head_split_over_two_reads_is_served(start: Any, audit_log: ListLog, parser: str,
                                                              first: str, cut: int) -> None:
    """The head behind the first request starts in one read and ends in the next: the scan must not
    read its middle as a request line (method, target), and the field count must still hold."""
    lst = await start(parser, "public", max_header_fields=MAXF)
    front = request("GET", "/healthz", {}) if first == "bodiless" else request("POST", "/healthz", {}, b"{}")
    second = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: a#b c\r\nConnection: close\r\n\r\n"
    data, closed = await exchange(lst.addr, [front + second[:cut], second[cut:]])
    statuses = [r.status for r in _parse_responses(data)]
    assert statuses == [200 if first == "bodiless" else 405, 200], statuses
    assert lst.reached == ["/healthz", "/healthz"]
    assert _codes(audit_log) == []


@pytest.mark.parametrize("head, code", [
    (b"connect / HTTP/1.1\r\n\r\n", CONNECT_CODE), (b"PRI * HTTP/2.0\r\n\r\n", CONNECT_CODE),
    (b"GETX / HTTP/1.1\r\n\r\n", CONNECT_CODE), (b"OPTIONSXY / HTTP/1.1\r\n\r\n", CONNECT_CODE),
    (b" / HTTP/1.1\r\n\r\n", CONNECT_CODE), (b"\r\nPATCH / HTTP/1.1\r\n\r\n", None),
    (b"DELETE / HTTP/1.1\r\n\r\n", None), (b"OPTIONS * HTTP/1.1\r\n\r\n", None)])
def test_head_scan_method_at_every_split(head: bytes, code: str | None) -> None:
    for cut in range(len(head) + 1):
        scan = HeadScan()
        got = scan.feed(head[:cut]) or scan.feed(head[cut:])
        assert got == code, (cut, got)
    plain, _ = whole_head_is_plain(head.lstrip(b"\r\n"))
    assert not (plain and code)  # the fast path never passes a head the scan refuses
