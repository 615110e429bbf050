"""Session 9 review, R9-3 (the cheap part): a request head without ``Host`` (HTTP/1.1) or with two
``Host`` fields answers 400 under both parsers (RFC 9112 section 3.2).

Before, httptools (the default parser) served both (200) while h11 answered its own plain-text 400
(it still does). Now under httptools the guard refuses them once the parser has accepted the head:
400 ``invalid_host`` (JSON, ``Connection: close``), audited ``http_guard``, nothing reaches the app;
also a head sent in pieces or pipelined behind a body. An HTTP/1.0 request may omit ``Host``.
Over real loopback sockets, both parsers, both listeners' head guard (the public one here).
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.host_field import HOST_CODE, fields_host_refused, head_host_refused
from tests.hostile.test_i10_header_limits import PARSERS, _parse_responses
from tests.hostile.test_i10_header_limits import config_overrides  # noqa: F401 - fixture
from tests.hostile.test_s7_upgrade_refused import exchange, guard_events, request, start  # noqa: F401 - fixture
from tests.support.audit_log import ListLog, audit_hub, audit_log  # noqa: F401 - fixtures

NO_HOST = b"GET /healthz HTTP/1.1\r\nAccept: */*\r\n\r\n"
TWO_HOSTS = b"GET /healthz HTTP/1.1\r\nHost: a.example\r\nAccept: */*\r\nhost: b.example\r\n\r\n"
BAD = {"no_host": NO_HOST, "two_hosts": TWO_HOSTS,
       "two_hosts_same": b"GET /healthz HTTP/1.1\r\nHost: a\r\nHOST: a\r\n\r\n"}


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("split", ["one_write", "two_writes", "behind_a_body"])
async def test_a_head_without_one_host_is_refused(start: Any, audit_log: ListLog, parser: str, case: str,  # noqa: F811
                                                  split: str) -> None:
    lst = await start(parser, "public")
    head = BAD[case]
    if split == "one_write":
        pieces = [head]
    elif split == "two_writes":
        pieces = [head[:20], head[20:]]  # not read whole: checked once complete
    else:  # pipelined in the same write behind a request with a body: the parser sees it unscanned
        pieces = [request("POST", "/healthz", {}, b"{}") + head]
    data, closed = await exchange(lst.addr, pieces)
    statuses = [r.status for r in _parse_responses(data)]
    assert closed
    assert statuses[-1] == 400, statuses  # before (httptools): 200
    assert lst.reached == (["/healthz"] if split == "behind_a_body" else [])  # the refused head never ran
    if parser == "httptools":  # h11 refuses such a head itself, before the guard's check (its own text 400)
        assert _parse_responses(data)[-1].json()["error"]["code"] == HOST_CODE
        assert [e.error_code for e in guard_events(audit_log) if e.endpoint == "http_guard"] == [HOST_CODE]


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("head", [b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n", b"GET /healthz HTTP/1.1\r\nhOsT: a\r\n\r\n",
                                  b"GET /healthz HTTP/1.0\r\n\r\n", b"GET /healthz HTTP/1.0\r\nHost: a\r\n\r\n"],
                         ids=["one_host", "one_host_odd_case", "http10_no_host", "http10_host"])
async def test_one_host_or_an_http10_request_without_is_served(start: Any, parser: str, head: bytes) -> None:  # noqa: F811
    lst = await start(parser, "public")
    data, _closed = await exchange(lst.addr, [head])
    assert [r.status for r in _parse_responses(data)] == [200]


def test_the_rules() -> None:
    assert not head_host_refused(b"GET / HTTP/1.1\r\nHost: a\r\nX-Host: b\r\n\r\n")
    assert head_host_refused(b"GET / HTTP/1.1\r\nX-Host: b\r\n\r\n")
    assert head_host_refused(b"GET / HTTP/1.1\nHost: a\nHost: a\n\n")
    assert head_host_refused(b"GET /\r\n\r\n")  # no version: not HTTP/1.0
    assert not head_host_refused(b"GET / HTTP/1.0\r\n\r\n")
    assert fields_host_refused([(b"accept", b"*/*")], "1.1")
    assert not fields_host_refused([(b"accept", b"*/*")], "1.0")
    assert fields_host_refused([(b"host", b"a"), (b"host", b"a")], "1.0")
    assert not fields_host_refused([(b"host", b"a")], "1.1")
