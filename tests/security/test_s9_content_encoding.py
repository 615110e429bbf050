"""Session 9 review, R9-4: a request's ``Content-Encoding`` was ignored.

The body was read as identity whatever the field said (``deflate``, ``br``, ``x-unknown`` with a
plain JSON body → 200, forwarded; ``gzip`` with a gzipped body → 400 "not valid UTF-8"): a WAF or
proxy in front that inflates before inspecting and the gateway read different bytes. Now any
coding other than ``identity`` answers **415** ``unsupported_content_encoding`` (with
``Accept-Encoding: identity``, RFC 9110 section 15.5.16) before the body is read, audited like the
other refusals of the pipeline; ``identity`` (or no field) is served. Over real loopback sockets,
both parsers.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import Any

import pytest

from gateway.content_coding import CODE, content_coding_problem
from tests.hostile.test_i10_header_limits import PARSERS, _parse_responses, close, read_until_closed
from tests.hostile.test_s7_upgrade_refused import request, start  # noqa: F401 - fixture
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

CHAT = {"model": "sim-model", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
CHAT_PATH = "/v1/chat/completions"


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {"limits": {"max_drain_bytes": 4096}}  # a declared 100 kB body is not drained before an answer


def _chat(stack: Any, encoding: str | None, body: bytes, extra: dict[str, str] | None = None) -> bytes:
    headers = {**stack.auth("tenant-a/app"), "Content-Type": "application/json", **(extra or {})}
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    return request("POST", CHAT_PATH, headers, body)


async def _one(addr: tuple[str, int], data: bytes) -> Any:
    reader, writer = await asyncio.open_connection(*addr)
    try:
        writer.write(data)
        await writer.drain()
        raw, _closed = await read_until_closed(reader, 10)
    finally:
        await close(writer)
    return _parse_responses(raw)


def _chat_events(log: ListLog) -> list[Any]:
    return [e for e in log.events if getattr(e, "endpoint", None) == CHAT_PATH]


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "zstd", "x-unknown", "identity, gzip", "GZIP"])
async def test_a_content_coded_body_is_refused_with_415(start: Any, stack: Any, audit_log: ListLog,  # noqa: F811
                                                        parser: str, encoding: str) -> None:
    lst = await start(parser, "public")
    plain = json.dumps(CHAT).encode()
    body = gzip.compress(plain) if encoding.lower().endswith("gzip") else plain
    responses = await _one(lst.addr, _chat(stack, encoding, body, {"Connection": "close"}))
    assert [r.status for r in responses] == [415], [r.status for r in responses]  # before: 200 (gzip: 400)
    assert responses[0].json()["error"]["code"] == CODE
    assert responses[0].headers["accept-encoding"] == ["identity"]
    events = _chat_events(audit_log)
    assert [(e.status_code, e.error_code) for e in events] == [(415, CODE)]
    assert events[0].tenant == "tenant-a"  # after authentication: audited with its tenant


@pytest.mark.parametrize("parser", PARSERS)
async def test_the_body_is_not_read_before_the_refusal(start: Any, stack: Any, audit_log: ListLog,  # noqa: F811
                                                       parser: str) -> None:
    """The head alone, a body declared (larger than the drain bound, under the size cap) but never sent:
    the 415 comes at once, with ``Connection: close``."""
    lst = await start(parser, "public")
    head = _chat(stack, "br", b"")
    head = head.replace(b"Content-Length: 0", b"Content-Length: 100000")
    reader, writer = await asyncio.open_connection(*lst.addr)
    try:
        writer.write(head)
        await writer.drain()
        raw, closed = await read_until_closed(reader, 10)
    finally:
        await close(writer)
    responses = _parse_responses(raw)
    assert [r.status for r in responses] == [415] and closed  # before: nothing until the body read timeout
    assert responses[0].headers["connection"] == ["close"]


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("encoding", [None, "identity", "Identity", ""])
async def test_identity_or_no_coding_is_served(start: Any, stack: Any, audit_log: ListLog,  # noqa: F811
                                               parser: str, encoding: str | None) -> None:
    lst = await start(parser, "public")
    responses = await _one(lst.addr, _chat(stack, encoding, json.dumps(CHAT).encode(), {"Connection": "close"}))
    assert [r.status for r in responses] == [200]


def test_content_coding_problem() -> None:
    assert content_coding_problem([(b"host", b"x")]) is None
    assert content_coding_problem([(b"content-encoding", b"identity")]) is None
    assert content_coding_problem([(b"content-encoding", b" IDENTITY , identity")]) is None
    assert content_coding_problem([(b"content-encoding", b"gzip")]) is not None
    assert content_coding_problem([(b"content-encoding", b"identity"), (b"content-encoding", b"br")]) is not None
