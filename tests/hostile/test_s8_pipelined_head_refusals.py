"""Session 8, security lows of the HTTP edge, under both parsers over real loopback sockets:

* a ``#`` in the request-target of a head pipelined behind another request in the same write (a head
  the guard's byte scan does not see: behind a body, or under h11 parsed from h11's own buffer) is
  answered 400 ``invalid_request_target`` like a first head's (R7-3), after the answer in front, and
  never reaches the app (before: served as the route);
* obsolete line folding (a head line starting with SP or HT): httptools refuses it (uvicorn's 400);
  h11 joined it into the field before and served the request (R7b-5). Both now answer 400 and the
  request never reaches the app, as a first head and pipelined; a pipelined head the parser refuses
  is answered after the answer in progress (httptools before: uvicorn's 400 at once, that answer lost).
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.upgrade_guard import TARGET_CODE
from gateway.head_fields import folded_head
from tests.hostile.test_i10_header_limits import PARSERS, _parse_responses  # noqa: F401
from tests.hostile.test_s7_upgrade_refused import exchange, guard_events, request, start  # noqa: F401 - fixture
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

parsers = pytest.mark.parametrize("parser", PARSERS)


@parsers
@pytest.mark.parametrize("first", ["bodiless", "with_body"])
async def test_a_fragment_in_a_pipelined_head_answers_400(start: Any, audit_log: ListLog, parser: str,  # noqa: F811
                                                          first: str) -> None:
    lst = await start(parser, "public")
    front = request("GET", "/healthz", {}) if first == "bodiless" else request("POST", "/healthz", {}, b"{}")
    data, closed = await exchange(lst.addr, [front + request("GET", "/healthz#x", {}) + request("GET", "/healthz", {})])
    responses = _parse_responses(data)
    assert closed
    assert [r.status for r in responses] == [200 if first == "bodiless" else 405, 400]  # before: a third answer
    assert responses[1].json()["error"]["code"] == TARGET_CODE
    assert lst.reached == ["/healthz"]
    assert [e.error_code for e in guard_events(audit_log) if e.endpoint == "http_guard"] == [TARGET_CODE]


FOLDED = b"GET /healthz HTTP/1.1\r\nHost: gateway.test\r\nX-Note: a\r\n folded\r\n\r\n"


@parsers
@pytest.mark.parametrize("where", ["first", "pipelined"])
async def test_obs_fold_answers_400_under_both_parsers(start: Any, audit_log: ListLog, parser: str,  # noqa: F811
                                                       where: str) -> None:
    lst = await start(parser, "public")
    front = request("GET", "/healthz", {}) if where == "pipelined" else b""
    data, closed = await exchange(lst.addr, [front + FOLDED + request("GET", "/healthz", {})])
    statuses = [r.status for r in _parse_responses(data)]
    assert closed
    assert statuses == ([200, 400] if where == "pipelined" else [400])  # h11 before: 200 (folded and served)
    assert lst.reached == (["/healthz"] if where == "pipelined" else [])
    assert [(e.status_code, e.error_code) for e in guard_events(audit_log)
            if e.endpoint == "http_guard"] == [(400, "invalid_request")]


@pytest.mark.parametrize("head,folded", [
    (FOLDED, True),
    (b"GET / HTTP/1.1\r\nHost: a\r\n\tb: c\r\n\r\n", True),
    (b"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n", False),
    (b"GET / HTTP/1.1\r\nHost: a\r\n\r\n body that starts with a space", False),
    (b"GET / HTTP/1.1\nHost: a\n\n\n x", False),
    (b"GET / HTTP/1.1\r\nHost: a\r\n x", True),  # a head still arriving
])
def test_folded_head(head: bytes, folded: bool) -> None:
    assert folded_head(head) is folded
