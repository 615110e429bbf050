"""Review R7b-2: a valid request followed in the SAME write by an ``Upgrade`` head.

Before the fix, under httptools, when the first request had a body the guard refused the pipelined
upgrade head while the first answer was in progress by closing the connection: the client got 0
bytes, the first request was audited 499 ``client_disconnect`` (although the gateway closed), and a
400 ``invalid_request`` was audited that was never sent. Now, under both parsers, the first request
is answered, then the 400 ``upgrade_not_supported``, then the connection closes; the audit holds the
first request's real status and exactly one ``http_guard`` event (the upgrade refusal).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.hostile.test_i10_header_limits import PARSERS, _parse_responses  # noqa: F401
from tests.hostile.test_i10_header_limits import config_overrides  # noqa: F401 - fixture
from tests.hostile.test_s7_upgrade_refused import (  # noqa: F401 - start: fixture
    CHAT, exchange, request, smuggling_pair, start)
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures
from gateway.upgrade_guard import UPGRADE_CODE


def _chunked(stack: Any, body: bytes) -> bytes:
    auth = stack.auth("tenant-a/app")
    head = ["POST /v1/chat/completions HTTP/1.1", "Host: gateway.test", "Transfer-Encoding: chunked",
            "Content-Type: application/json"] + [f"{k}: {v}" for k, v in auth.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("framing", ["content_length", "chunked"])
async def test_first_answer_then_400_under_both_parsers(start: Any, stack: Any, audit_log: ListLog,
                                                         parser: str, framing: str) -> None:
    lst = await start(parser, "public")
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "hello"}]}).encode()
    if framing == "chunked":
        first = _chunked(stack, body)
    else:
        first = request("POST", "/v1/chat/completions",
                        {**stack.auth("tenant-a/app"), "Content-Type": "application/json"}, body)
    outer, _after = smuggling_pair(stack, "public", "h2c")
    data, closed = await exchange(lst.addr, [first + outer])
    responses = _parse_responses(data)
    assert closed
    assert [r.status for r in responses] == [200, 400], [r.status for r in responses]  # before: [] (httptools)
    assert responses[1].json()["error"]["code"] == UPGRADE_CODE
    assert lst.reached == ["/v1/chat/completions"]  # the upgrade request (and the one in its body) never ran
    guard = [e.error_code for e in audit_log.events if getattr(e, "endpoint", None) == "http_guard"]
    assert guard == [UPGRADE_CODE]  # before: also a 400 invalid_request never sent
    chats = [e for e in audit_log.events if getattr(e, "endpoint", None) == "/v1/chat/completions"]
    assert [e.status_code for e in chats] == [200]  # before: 499 client_disconnect


@pytest.mark.parametrize("parser", PARSERS)
async def test_two_pipelined_requests_answered_before_the_400(start: Any, stack: Any, audit_log: ListLog,
                                                              parser: str) -> None:
    """The deferred 400 waits for every request queued before the refused head, not just the first."""
    lst = await start(parser, "public")
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "hello"}]}).encode()
    chat = request("POST", "/v1/chat/completions",
                   {**stack.auth("tenant-a/app"), "Content-Type": "application/json"}, body)
    outer, _after = smuggling_pair(stack, "public", "h2c")
    data, closed = await exchange(lst.addr, [chat + chat + outer])
    assert closed
    assert [r.status for r in _parse_responses(data)] == [200, 200, 400]
    assert lst.reached == ["/v1/chat/completions"] * 2
