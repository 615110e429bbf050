"""Session 15, issue 14: the usual request's short path through the guarded httptools protocol.

:func:`gateway.head_scan.usual_head` decides, in one function, that a read holding a whole head and the start of
its body has nothing any head guard refuses; the guarded protocol then hands it to the parser at once
(``GuardedHttpToolsProtocol.data_received``) instead of through ``HeadGuard.guard_feed`` and the scan. Checked here:

- soundness against the general path: whenever ``usual_head`` accepts, :class:`ScannedHeadFields` (field
  count, method / ``#`` / ``Upgrade`` scan, ``Host`` verdict, body verdict) would have let the same read through
  and parsed head and body together (hypothesis over heads built from risky pieces);
- in process, one read per request under both parsers (h11 always takes the general path): every head a head
  guard refuses is still refused with the same status and nothing reaches the app, among them the ones only the
  scan refuses (an ``Upgrade`` field without ``Connection: upgrade``, one field over the bound, a method outside
  the list): a ``usual_head`` missing one of its checks fails here.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import uvicorn
from hypothesis import given, settings
from hypothesis import strategies as st
from uvicorn.server import ServerState

from gateway.head_scan import ScannedHeadFields, usual_head
from gateway.http_guard import guarded_protocol

MAX_FIELDS = 8

_methods = st.sampled_from([b"POST", b"GET", b"post", b"CONNECT", b"PUT", b"G#T"])
_targets = st.sampled_from([b"/v1/completions", b"/a#b", b"/x?q=#", b"/%23", b"*"])
_names = st.sampled_from([b"Host", b"host", b"HOST", b"Upgrade", b"upgrade", b"Upgrade-Insecure-Requests",
                          b"Content-Length", b"content-length", b"Transfer-Encoding", b"Connection", b"X-Host"])
_values = st.sampled_from([b"x", b"0", b"00", b"12", b" 7 ", b"1 2", b"5, 5", b"chunked", b"h2c", b"#frag",
                          b"transfer-encoding", b"upgrade", b""])
_fields = st.lists(st.tuples(_names, _values, st.sampled_from([b":", b" :", b": "])), max_size=MAX_FIELDS + 2)
_eols = st.sampled_from([b"\r\n", b"\n"])


def _read(method: bytes, target: bytes, fields: list[tuple[bytes, bytes, bytes]], eol: bytes, end_eol: bytes,
          body: bytes, lead: bytes = b"") -> bytes:
    lines = [method + b" " + target + b" HTTP/1.1"] + [n + c + v for n, v, c in fields]
    return lead + eol.join(lines) + eol + end_eol + body


@settings(max_examples=3000, deadline=None)
@given(_methods, _targets, _fields, _eols, _eols, st.sampled_from([b"", b"{}", b"x" * 40]),
       st.sampled_from([b"", b"\r\n"]))
def test_usual_head_accepts_only_what_the_general_path_lets_through_whole(
        method: bytes, target: bytes, fields: list[tuple[bytes, bytes, bytes]], eol: bytes, end_eol: bytes,
        body: bytes, lead: bytes) -> None:
    data = _read(method, target, fields, eol, end_eol, body, lead)
    cut = usual_head(data, MAX_FIELDS)
    general = ScannedHeadFields(MAX_FIELDS)
    ok = general.feed(data)
    # what HeadGuard.guard_feed does with the read: a head and its body's start in one parse when all hold
    whole = ok and general.refusal is None and 0 < general.end < len(data) and general.body
    if cut > 0:
        assert whole and general.hosts is True and general.end == cut
        assert data[cut - 4:cut] == b"\r\n\r\n"
    elif whole and general.hosts is True and eol == end_eol == b"\r\n" and not lead:
        # the general path's one-parse case with a head in CRLF: usual_head takes it too unless its Host
        # verdict came from the request line (HTTP/1.0 without Host: not the usual request)
        low = data[:general.end].lower()
        assert low.count(b"\nhost:") != 1


def test_usual_head_takes_the_usual_request() -> None:
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2\r\n\r\n")
    assert usual_head(head + b"{}", MAX_FIELDS) == len(head)
    assert usual_head(head, MAX_FIELDS) == -1  # no body byte in this read: the general path


# ---------------------------------------------------------------- in process, one read per request, both parsers
class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.out: list[bytes] = []
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5555), "sockname": ("127.0.0.1", 8080)}.get(name, default)

    def write(self, data: Any) -> None:
        self.out.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return 0


async def _serve_one(parser: str, data: bytes) -> tuple[bytes, list[str]]:
    """One read ``data`` on a fresh guarded connection: (every byte written, paths that reached the app)."""
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["path"])
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    cls = guarded_protocol(parser, max_header_fields=MAX_FIELDS)
    config = uvicorn.Config(app, http=cls, proxy_headers=False, lifespan="off", log_level="critical",
                            access_log=False, server_header=False)
    config.load()
    loop = asyncio.get_running_loop()
    proto = cls(config=config, server_state=ServerState(), app_state={}, _loop=loop)  # type: ignore[call-arg]
    transport = _Transport()
    proto.connection_made(transport)
    proto.data_received(data)
    for _ in range(50):  # the app's task, and the coalesced write at the end of the loop step
        await asyncio.sleep(0)
        if transport.closing or any(b"ok" in o for o in transport.out):
            break
    proto.connection_lost(None)
    return b"".join(transport.out), reached


def _request(fields: bytes, method: bytes = b"POST", target: bytes = b"/v1/completions") -> bytes:
    return (method + b" " + target + b" HTTP/1.1\r\n" + fields + b"Content-Type: application/json\r\n"
            b"Content-Length: 2\r\n\r\n{}")


_CASES = {
    "usual": (_request(b"Host: gw\r\n"), 200, None),
    "upgrade_without_connection": (_request(b"Host: gw\r\nUpgrade: h2c\r\n"), 400, "upgrade_not_supported"),
    "upgrade_websocket": (_request(b"Host: gw\r\nConnection: Upgrade\r\nupgrade: websocket\r\n"), 400,
                          "upgrade_not_supported"),
    "fragment": (_request(b"Host: gw\r\n", target=b"/v1/completions#x"), 400, "invalid_request_target"),
    "lower_case_method": (_request(b"Host: gw\r\n", method=b"post"), 400, "method_not_supported"),
    "connect": (_request(b"Host: gw\r\n", method=b"CONNECT", target=b"gw:443"), 400, "method_not_supported"),
    "extension_method": (_request(b"Host: gw\r\n", method=b"PROPFIND"), 400, "method_not_supported"),
    "fields_over_the_bound": (_request(b"Host: gw\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(MAX_FIELDS - 2))),
                              431, "too_many_header_fields"),
    "two_hosts": (_request(b"Host: gw\r\nHost: other\r\n"), 400, None),
    "no_host": (_request(b""), 400, None),
    "folded": (_request(b"Host: gw\r\nX-A: a\r\n folded\r\n"), 400, None),
}


@pytest.mark.parametrize("parser", ["h11", "httptools"])
@pytest.mark.parametrize("case", sorted(_CASES))
async def test_one_read_requests_are_refused_or_served_as_before(parser: str, case: str) -> None:
    data, status, code = _CASES[case]
    out, reached = await _serve_one(parser, data)
    assert out.startswith(b"HTTP/1.1 %d " % status), out[:80]
    if status == 200:
        assert reached == ["/v1/completions"]
        return
    assert reached == []
    if code is not None:
        body = out.split(b"\r\n\r\n", 1)[1]
        assert json.loads(body)["error"]["code"] == code
