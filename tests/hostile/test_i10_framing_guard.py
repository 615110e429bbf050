"""Unit tests of gateway.framing (issue 10): the framing checks and the bounded drain,
driven with fake ASGI receive/send callables (no server, no parser)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.framing import FramingGuard, drain_cap, framing_problem

MiB = 1 << 20


def H(*pairs: tuple[str, str]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode(), v.encode()) for k, v in pairs]


@pytest.mark.parametrize("headers,refused", [
    (H(("content-length", "5")), False),
    (H(("transfer-encoding", "chunked")), False),
    (H(("transfer-encoding", "Chunked")), False),
    (H(), False),
    (H(("content-length", "5"), ("content-length", "5")), False),
    (H(("content-length", "5"), ("transfer-encoding", "chunked")), True),
    (H(("transfer-encoding", "chunked"), ("content-length", "0")), True),
    (H(("content-length", "5"), ("content-length", "6")), True),
    (H(("content-length", "5, 6")), True),
    (H(("content-length", "-1")), True),
    (H(("content-length", "+5")), True),
    (H(("content-length", "0x10")), True),
    (H(("transfer-encoding", "gzip, chunked")), True),
    (H(("transfer-encoding", "chunked"), ("transfer-encoding", "chunked")), True),
    (H(("transfer-encoding", "identity")), True),
])
def test_framing_problem(headers, refused):
    assert (framing_problem(headers) is not None) is refused


def test_drain_cap():
    assert drain_cap(65536) == 8 * MiB
    assert drain_cap(4 * MiB) == 16 * MiB


class Fake:
    """A client body as ASGI messages, and everything the app/guard sends."""

    def __init__(self, chunks: list[bytes] | None = None, endless: int = 0, hang: bool = False) -> None:
        self.chunks = list(chunks or [])
        self.endless = endless  # > 0: yield chunks of this size forever
        self.hang = hang
        self.receives = 0
        self.sent: list[dict[str, Any]] = []
        self.receives_at_start: int | None = None

    async def receive(self) -> dict[str, Any]:
        self.receives += 1
        if self.hang:
            await asyncio.Event().wait()
        if self.endless:
            return {"type": "http.request", "body": b"x" * self.endless, "more_body": True}
        if self.chunks:
            body = self.chunks.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(self.chunks)}
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.receives_at_start = self.receives
        self.sent.append(message)

    def start(self) -> dict[str, Any]:
        return next(m for m in self.sent if m["type"] == "http.response.start")

    def closes(self) -> bool:
        return (b"connection", b"close") in [(bytes(k).lower(), bytes(v).lower()) for k, v in self.start()["headers"]]


async def refuse_at_once(scope: Any, receive: Any, send: Any) -> None:
    """An app that answers 401 without reading the body."""
    await send({"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"no"})


def scope(*headers: tuple[str, str]) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/v1/completions", "headers": H(*headers)}


async def test_small_unread_body_drained_before_answer_connection_kept():
    fake = Fake([b"a" * 1000, b"b" * 1000])
    guard = FramingGuard(refuse_at_once, max_drain_bytes=8 * MiB, drain_timeout_s=5)
    await guard(scope(("content-length", "2000")), fake.receive, fake.send)
    assert fake.receives_at_start == 2  # the whole body was read before the answer started
    assert fake.start()["status"] == 401
    assert not fake.closes()


async def test_endless_chunked_body_drained_only_up_to_the_cap():
    fake = Fake(endless=MiB)
    guard = FramingGuard(refuse_at_once, max_drain_bytes=3 * MiB, drain_timeout_s=30)
    await guard(scope(("transfer-encoding", "chunked")), fake.receive, fake.send)
    assert fake.receives == 4  # 3 MiB read, the 4th chunk crosses the cap: stop
    assert fake.start()["status"] == 401 and fake.closes()


async def test_declared_length_over_the_cap_not_read_at_all():
    fake = Fake(endless=MiB)
    guard = FramingGuard(refuse_at_once, max_drain_bytes=3 * MiB, drain_timeout_s=30)
    await guard(scope(("content-length", str(3 * MiB + 1))), fake.receive, fake.send)
    assert fake.receives == 0
    assert fake.closes()


async def test_expect_100_continue_not_invited():
    fake = Fake([b"a" * 10])
    guard = FramingGuard(refuse_at_once, max_drain_bytes=3 * MiB, drain_timeout_s=30)
    await guard(scope(("content-length", "10"), ("expect", "100-continue")), fake.receive, fake.send)
    assert fake.receives == 0  # reading would make the server send "100 Continue"
    assert fake.closes()


async def test_drain_stops_at_the_deadline():
    fake = Fake(hang=True)
    guard = FramingGuard(refuse_at_once, max_drain_bytes=3 * MiB, drain_timeout_s=0.05)
    await asyncio.wait_for(guard(scope(("content-length", "10")), fake.receive, fake.send), 10)
    assert fake.start()["status"] == 401 and fake.closes()


async def test_ambiguous_framing_answered_400_without_the_app():
    called = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        called.append(scope)

    fake = Fake([b"x"])
    guard = FramingGuard(app, max_drain_bytes=MiB, drain_timeout_s=1)
    await guard(scope(("content-length", "5"), ("transfer-encoding", "chunked")), fake.receive, fake.send)
    assert called == [] and fake.receives == 0
    assert fake.start()["status"] == 400 and fake.closes()
    assert b"invalid_framing" in fake.sent[1]["body"]


async def test_read_body_passes_through_untouched():
    seen = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            m = await receive()
            seen.append(m["body"])
            if not m["more_body"]:
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    fake = Fake([b"ab", b"cd"])
    await FramingGuard(app, max_drain_bytes=MiB, drain_timeout_s=1)(scope(("transfer-encoding", "chunked")),
                                                                      fake.receive, fake.send)
    assert seen == [b"ab", b"cd"] and not fake.closes()
