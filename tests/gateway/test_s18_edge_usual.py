"""Session 18 (issue 14): which reads take the usual request's guard path (gateway/edge_usual.py), on the
guarded httptools protocol itself with exact reads (a fake transport: the read boundaries are the test's).

- each kind of unusual read does NOT take the usual path (split head, split body, pipelined bytes after the
  body, chunked, ``Expect``, HTTP/1.0, ``Connection``, a body shorter or longer than its ``Content-Length``,
  odd spellings, a head over ``max_header_bytes``, a read while an answer is in progress);
- for every case the protocol does the same with the path on and off: the bytes written, whether it closed,
  what the app received (body, ``more_body``), and the request scope's guard keys (body wire bytes, body
  complete, the loss and send-order hooks);
- :func:`usual_whole` itself on each unusual spelling.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from gateway.body_guard import BODY_COMPLETE_KEY, WIRE_SCOPE_KEY
from gateway.client_io import LOSS_KEY
from gateway.edge_usual import UsualRequest, usual_whole
from gateway.head_scan import usual_head
from gateway.http_guard import guarded_protocol
from gateway.send_order import SCOPE_KEY as SENDS_KEY
from tests.support.waiting import wait_for

BODY = b'{"model":"m","prompt":"hello there","max_tokens":1}'


def req(body: bytes = BODY, *, method: str = "POST", version: str = "1.1", extra: str = "",
        length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return (f"{method} /v1/completions HTTP/{version}\r\nHost: gw\r\nAuthorization: Bearer t\r\n{extra}"
            f"Content-Type: application/json\r\nContent-Length: {n}\r\n\r\n").encode() + body


WHOLE = req()
CUT = WHOLE.index(b"\r\n\r\n") + 4
CHUNKED = (b"POST /v1/completions HTTP/1.1\r\nHost: gw\r\nTransfer-Encoding: chunked\r\n\r\n"
           + b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY))

#: name -> reads (each a separate data_received); none of them is the usual request
UNUSUAL: dict[str, list[bytes]] = {
    "split_head": [WHOLE[:30], WHOLE[30:]],
    "split_body": [WHOLE[:CUT + 4], WHOLE[CUT + 4:]],
    "pipelined": [WHOLE + WHOLE],
    "pipelined_partial_head": [WHOLE + WHOLE[:20], WHOLE[20:]],
    "chunked": [CHUNKED],
    "expect": [req(extra="Expect: 100-continue\r\n")],
    "http10": [req(version="1.0")],
    "connection_close": [req(extra="Connection: close\r\n")],
    "connection_keep_alive": [req(extra="Connection: keep-alive\r\n")],
    "short_body": [req(length=len(BODY) + 3), b"   "],
    "long_body": [req(length=len(BODY) - 1)],
    "space_before_colon": [WHOLE.replace(b"Content-Type:", b"Content-Type :")],
    "bare_lf": [WHOLE.replace(b"Host: gw\r\n", b"Host: gw\n")],
    "obs_fold": [WHOLE.replace(b"Bearer t\r\n", b"Bearer\r\n t\r\n")],
    "two_lengths": [WHOLE.replace(b"Host: gw\r\n", b"Host: gw\r\nContent-Length: %d\r\n" % len(BODY))],
    "two_hosts": [WHOLE.replace(b"Host: gw\r\n", b"Host: gw\r\nHost: x\r\n")],
    "upgrade": [req(extra="Upgrade: websocket\r\n")],
    "hash_target": [WHOLE.replace(b"/v1/completions", b"/v1/completions#x")],
    "put": [req(method="PUT")],
    "oversized": [req(extra="X-Pad: %s\r\n" % ("p" * 5000))],
}


class Transport(asyncio.Transport):
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

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


class App:
    """Records each request's body and guard keys; answers 200 (after ``gate`` when one is set)."""

    def __init__(self) -> None:
        self.seen: list[Any] = []
        self.gate: asyncio.Event | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body, more = b"", True
        complete = scope.get(BODY_COMPLETE_KEY, False)
        while more:
            msg = await receive()
            if msg["type"] != "http.request":
                break
            body += msg.get("body", b"")
            more = msg.get("more_body", False)
        wire = scope[WIRE_SCOPE_KEY].bytes
        self.seen.append((scope["method"], scope["http_version"], body, wire, complete,
                          scope.get(LOSS_KEY) is not None, scope.get(SENDS_KEY) is not None))
        if self.gate is not None:
            await self.gate.wait()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})


async def run(reads: list[bytes], on: bool, *, answers: int | None = None, monkeypatch: Any) -> tuple[Any, int]:
    """Feed ``reads`` to a guarded protocol (max_header_bytes 4096) with the usual path ``on``; returns what
    it did and how often the usual path was taken."""
    taken: list[int] = []
    feed = UsualRequest.guard_feed_usual

    def counted(self: Any, data: bytes, cut: int) -> None:
        taken.append(len(data))
        feed(self, data, cut)

    monkeypatch.setattr(UsualRequest, "guard_feed_usual", counted)
    app = App()
    cls = guarded_protocol("httptools", max_header_bytes=4096)
    cls.guard_usual_request = on
    config = uvicorn.Config(app, http=cls, proxy_headers=False, lifespan="off", log_level="critical",
                            access_log=False, server_header=False, date_header=False)
    config.load()
    proto = cls(config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
    t = Transport()
    proto.connection_made(t)
    for data in reads:
        proto.data_received(data)
        await asyncio.sleep(0)
    expected = answers if answers is not None else 1
    await wait_for(lambda: t.closing or b"".join(t.out).count(b"HTTP/1.1 ") >= expected, timeout_s=10,
                   what="the answers")
    for task in list(proto.tasks):
        await task
    closed = t.closing
    proto.connection_lost(None)
    return (b"".join(t.out), closed, app.seen), len(taken)


async def test_the_usual_request_takes_the_path_and_does_what_todays_does(monkeypatch: Any) -> None:
    on, n_on = await run([WHOLE, WHOLE], True, answers=2, monkeypatch=monkeypatch)
    off, n_off = await run([WHOLE, WHOLE], False, answers=2, monkeypatch=monkeypatch)
    assert (n_on, n_off) == (2, 0)
    assert on == off
    out, closed, seen = on
    assert out.count(b"HTTP/1.1 200 OK") == 2 and not closed
    assert seen[0] == ("POST", "1.1", BODY, len(BODY), True, True, True)


@pytest.mark.parametrize("name", sorted(UNUSUAL))
async def test_an_unusual_read_takes_todays_path(name: str, monkeypatch: Any) -> None:
    reads = UNUSUAL[name]
    answers = 2 if name.startswith("pipelined") else 1
    on, n_on = await run(reads, True, answers=answers, monkeypatch=monkeypatch)
    off, n_off = await run(reads, False, answers=answers, monkeypatch=monkeypatch)
    assert n_on == 0 and n_off == 0
    assert on == off


async def test_a_read_while_an_answer_is_in_progress_takes_todays_path(monkeypatch: Any) -> None:
    results = []
    for on in (True, False):
        taken: list[int] = []
        feed = UsualRequest.guard_feed_usual
        monkeypatch.setattr(UsualRequest, "guard_feed_usual",
                            lambda self, data, cut, _t=taken, _f=feed: (_t.append(1), _f(self, data, cut))[1])
        app = App()
        app.gate = asyncio.Event()
        cls = guarded_protocol("httptools", max_header_bytes=4096)
        cls.guard_usual_request = on
        config = uvicorn.Config(app, http=cls, lifespan="off", log_level="critical", access_log=False,
                                server_header=False, date_header=False)
        config.load()
        proto = cls(config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop())
        t = Transport()
        proto.connection_made(t)
        proto.data_received(WHOLE)
        await wait_for(lambda: app.seen, timeout_s=10, what="the first request at the app")
        before = len(taken)
        proto.data_received(WHOLE)  # pipelined in its own read, the first answer not sent yet
        assert len(taken) == before
        app.gate.set()
        await wait_for(lambda: b"".join(t.out).count(b"HTTP/1.1 200") == 2, timeout_s=10, what="both answers")
        for task in list(proto.tasks):
            await task
        results.append((b"".join(t.out), app.seen, len(taken)))
    assert results[0][:2] == results[1][:2]
    assert (results[0][2], results[1][2]) == (1, 0)


# "oversized" is the protocol's check (the read within max_header_bytes), not the spelling's
@pytest.mark.parametrize("name", sorted(n for n in UNUSUAL if len(UNUSUAL[n]) == 1 and n != "oversized"))
def test_usual_whole_refuses_each_unusual_spelling(name: str) -> None:
    data = UNUSUAL[name][0]
    assert usual_whole(data, 100) == -1
    assert usual_head(data, 100, True) == (-1 if usual_head(data, 100) < 0 else -usual_head(data, 100))


def test_usual_whole_accepts_the_usual_request() -> None:
    assert usual_whole(WHOLE, 100) == usual_head(WHOLE, 100) == CUT
    upper = WHOLE.replace(b"Content-Length:", b"CONTENT-LENGTH:")  # field names are case-blind for both paths
    assert usual_whole(upper, 100) == CUT


def test_uvicorn_names_the_usual_path_binds_exist() -> None:
    """The usual parser binds uvicorn's own parser callbacks (gateway/edge_usual.py): an uvicorn upgrade that
    renames one, or an httptools without the leniency uvicorn sets, must fail here."""
    import httptools
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    for name in ("on_message_begin", "on_url", "on_header", "on_headers_complete", "on_body", "on_message_complete",
                 "data_received"):
        assert callable(getattr(HttpToolsProtocol, name, None)), name
    assert callable(getattr(httptools.HttpRequestParser(object()), "set_dangerous_leniencies", None))
