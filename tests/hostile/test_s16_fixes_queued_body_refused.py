"""Review R15-2: a request whose body is refused while it waits behind another request's answer.

Two (or three) requests sent in one write, the last one chunked with a trailer field (or in too many
chunks). Before the fix, under httptools, the body refusal (400 ``trailers_not_allowed`` /
``body_too_fragmented``) went out at once and the connection closed: the answer in progress was lost
(audited ``client_disconnect``) and the refusal was audited nowhere (the refused request's app never
ran). Now, under both parsers: every answer ahead of it arrives whole, then the 400 with its code,
then the close; the refusal is in the audit log once, with its code; nothing of the refused request
reaches a replica. Under httptools the refused request is taken out of uvicorn's ``pipeline`` queue
(gateway/upgrade_guard.py ``guard_defer_queued``): these tests fail if that queue changes meaning.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.hostile.conftest import CaptureReplicas
from tests.hostile.test_i10_header_limits import PARSERS, _parse_responses
from tests.hostile import test_s7_upgrade_refused as s7
from tests.hostile.test_s7_upgrade_refused import CHAT, exchange, request
from tests.support import audit_log as audit_fixtures
from tests.support.audit_log import ListLog
from tests.support.waiting import wait_for

# fixtures: a listener whose guard refusals are audited (s7's ``start``), the stack on a ListLog
start, audit_hub, audit_log = s7.start, audit_fixtures.audit_hub, audit_fixtures.audit_log

ROUTE = "/v1/chat/completions"
MARK = "REFUSED-BODY-MARK"  # in the refused request's body only: no replica may ever see it


def _chat_body(word: str) -> bytes:
    return json.dumps({**CHAT, "messages": [{"role": "user", "content": word}]}).encode()


def _chunked_head(stack: Any) -> bytes:
    auth = stack.auth("tenant-a/app")
    head = [f"POST {ROUTE} HTTP/1.1", "Host: gateway.test", "Transfer-Encoding: chunked",
            "Content-Type: application/json"] + [f"{k}: {v}" for k, v in auth.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode()


def accepted(stack: Any, framing: str) -> bytes:
    """A chat request the gateway serves (200), Content-Length or chunked (no trailer)."""
    body = _chat_body("hello")
    if framing == "chunked":
        return _chunked_head(stack) + b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    return request("POST", ROUTE, {**stack.auth("tenant-a/app"), "Content-Type": "application/json"}, body)


def refused_request(stack: Any, why: str) -> tuple[bytes, str]:
    """(a chat request whose body the guard refuses, the refusal's code)."""
    body = _chat_body(MARK)
    if why == "trailer":
        return _chunked_head(stack) + b"%x\r\n" % len(body) + body + b"\r\n0\r\nx-trailer: v\r\n\r\n", \
            "trailers_not_allowed"
    # one byte per chunk: past limits.max_body_chunks (256 by default) plus one per KiB
    pieces = b"".join(b"1\r\n%s\r\n" % body[i:i + 1] for i in range(len(body)))
    pad = b"1\r\n \r\n" * 300
    return _chunked_head(stack) + pieces + pad + b"0\r\n\r\n", "body_too_fragmented"


def _events_with(log: ListLog, code: str) -> list[Any]:
    return [e for e in log.events if getattr(e, "error_code", None) == code]


async def _check(lst: Any, capture: CaptureReplicas, audit_log: ListLog, data: bytes, closed: bool,
                 served: int, code: str, parser: str) -> None:
    responses = _parse_responses(data)
    assert closed, "the connection stayed open after the refusal"
    # every answer ahead of the refused request whole, then the 400 (before, httptools: [400], first lost)
    assert [r.status for r in responses] == [200] * served + [400], [r.status for r in responses]
    for r in responses[:served]:
        assert r.json()["choices"], "an answer ahead of the refusal was cut"
    assert responses[-1].json()["error"]["code"] == code
    assert responses[-1].headers["connection"] == ["close"]
    # the refusal audited once with its code (before: nowhere under httptools); the answers as served
    await wait_for(lambda: _events_with(audit_log, code), what=f"the {code} refusal in the audit log")
    assert len(_events_with(audit_log, code)) == 1
    chats = await wait_for(lambda: (c := [e for e in audit_log.events if getattr(e, "endpoint", None) == ROUTE
                                          and e.status_code == 200]) and len(c) >= served and c,
                           what="the served requests' audit events")
    assert len(chats) == served
    assert not _events_with(audit_log, "client_disconnect")  # before: the first request's record
    # nothing of the refused request reached a replica; the served ones did
    assert len(capture.seen) == served
    assert all(MARK.encode() not in c.raw for c in capture.seen)
    if parser == "httptools":
        assert lst.reached == [ROUTE] * served  # its app never ran (taken out of uvicorn's queue)
        guard = [e for e in audit_log.events if getattr(e, "endpoint", None) == "http_guard"]
        assert [(e.status_code, e.error_code, e.outcome.value) for e in guard] == [(400, code, "rejected")]


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("ahead, framing, why", [
    (1, "content_length", "trailer"), (1, "chunked", "trailer"), (1, "content_length", "fragmented"),
    (1, "chunked", "fragmented"),
    (2, "content_length", "trailer"),  # one running, one queued behind it: both answered before the 400
])
async def test_answers_ahead_whole_then_the_400_then_close(start: Any, stack: Any, capture: CaptureReplicas,
                                                           audit_log: ListLog, parser: str, ahead: int, framing: str,
                                                           why: str) -> None:
    lst = await start(parser, "public")
    refused, code = refused_request(stack, why)
    data, closed = await exchange(lst.addr, [accepted(stack, framing) * ahead + refused])
    await _check(lst, capture, audit_log, data, closed, ahead, code, parser)


@pytest.mark.parametrize("parser", PARSERS)
async def test_refused_alone_still_answered_at_once(start: Any, stack: Any, capture: CaptureReplicas,
                                                    audit_log: ListLog, parser: str) -> None:
    """Nothing ahead of it: the 400 and the close at once, audited by the app (gateway/framing.py), as before."""
    lst = await start(parser, "public")
    second, code = refused_request(stack, "trailer")
    data, closed = await exchange(lst.addr, [second])
    assert closed
    assert [r.status for r in _parse_responses(data)] == [400]
    await wait_for(lambda: _events_with(audit_log, code), what=f"the {code} refusal in the audit log")
    assert len(_events_with(audit_log, code)) == 1
    assert capture.seen == []
