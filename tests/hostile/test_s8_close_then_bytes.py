"""Session 8 second review, R8b-1: under h11 a bodiless request sent with ``Connection: close`` and
followed in the same write by more bytes (a pipelined request, or one stray byte) got uvicorn's text
400 at once instead of its answer, while the audit recorded the request as served. Bytes after a
``Connection: close`` request are never a request (RFC 9112 section 9.6): they are now dropped
unparsed, the request is answered and the connection closes, under both parsers.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.hostile.test_i10_header_limits import PARSERS, _parse_responses  # noqa: F401
from tests.hostile.test_s7_upgrade_refused import exchange, guard_events, request, start  # noqa: F401 - fixture
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

CLOSE = {"Connection": "close"}


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("trailing", [b"X", request("GET", "/healthz", {}), request("POST", "/healthz", {}, b"{}")],
                         ids=["one_byte", "pipelined_get", "pipelined_post"])
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_bytes_after_a_close_request_are_dropped_and_the_request_answered(
        start: Any, audit_log: ListLog, parser: str, trailing: bytes, method: str) -> None:  # noqa: F811
    lst = await start(parser, "public")
    first = request("GET", "/healthz", CLOSE) if method == "GET" else request("POST", "/healthz", CLOSE, b"{}")
    data, closed = await exchange(lst.addr, [first + trailing])
    responses = _parse_responses(data)
    assert closed
    assert [r.status for r in responses] == [200 if method == "GET" else 405]  # h11 before (GET): [400]
    assert lst.reached == ["/healthz"]  # the trailing request never reached the app
    assert [e for e in guard_events(audit_log) if e.endpoint == "http_guard"] == []
