"""Session 24 (issue 14), helper relay: a streamed answer's relay with less work per SSE event, against the
relay as it was.

- The read bound of an identity stream (``upstream.read_timeout_s`` between two chunks) is the upstream
  response's own timer (:meth:`gateway.upstream_response.UpstreamResponse.bound_reads`) instead of a
  :class:`gateway.read_deadline.ReadDeadline` around each read. The old mechanism is still the one of a
  coded stream, so the reference here is the same stream read through a pass-through "coding" (the
  ``ReadDeadline`` path).
- The parts between a stream's start and its last part go from the stall-bounded send to the server's
  ``send`` directly (``StallBoundedSend(body_send=...)``); the reference sends every part through the
  inference routes' wrapper (``body_send=None``), as before.
- The scanner learns no delta-event shape from an event that ends its one choice (``finish_reason`` set).

Differential (hypothesis): random SSE streams (deltas, finish events, usage, bad JSON, error events,
comments, a missing ``[DONE]``) cut at random points into upstream reads, several events a read or one event
over several; the upstream ends cleanly, is reset, or stalls past the read bound; the client reads, or
stops reading (the write-stall bound). Both relays must send the client the same messages, in the same
order with the last part after the audit hand-off, and leave the same record, usage, relayed count,
charge basis, breaker verdict and ending. Each relay runs in a task of its own (the write-stall code is a
context variable of the request's task)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.inference_asgi import _sender
from gateway.pipeline_answer import stream_response
from gateway.proxy import IDENTITY, UpstreamStream
from gateway.sse import SseScanner
from gateway.upstream_conn import UpstreamConnectionLost
from gateway.upstream_response import UpstreamResponse
from gateway.write_stall import StallBoundedSend, WriteStall

BOUND_S = 0.03  # the read bound and the write-stall bound of the cases that pass them (real loop time)


class _Conn:
    """The answer's connection (:class:`gateway.upstream_response.AnswerSource`)."""

    def __init__(self) -> None:
        self.aborted = False

    def resume(self) -> None:
        pass

    def abort(self) -> None:
        self.aborted = True


class _PassCoding:
    """A "content coding" that passes bytes through: the stream takes the coded path (ReadDeadline per read)."""

    coding = "x-test-pass"
    backlog = b""

    def feed_some(self, raw: bytes) -> bytes:
        return raw

    def feed(self, raw: bytes) -> bytes:
        return raw

    def finish(self) -> bytes:
        return b""


def _delta(text: str, finish: bool = False, chat: bool = False) -> str:
    choice: dict[str, Any] = ({"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text})
    choice["logprobs"] = None
    choice["finish_reason"] = "length" if finish else None
    return "data: " + json.dumps({"id": "cmpl-1", "object": "x", "created": 1, "model": "m", "choices": [choice],
                                  "usage": None}, separators=(",", ":")) + "\n\n"


_USAGE = "data: " + json.dumps({"id": "cmpl-1", "choices": [], "usage": {
    "prompt_tokens": 5, "completion_tokens": 9, "prompt_tokens_details": {"cached_tokens": 3}}}) + "\n\n"
_TEXT = st.text(alphabet=st.sampled_from(list(" abcxyz\u00e9\u4e2d") + ['"', "\\", "\n"]), max_size=12)
_EVENT = st.one_of(
    _TEXT.map(_delta),
    _TEXT.map(lambda t: _delta(t, chat=True)),
    _TEXT.map(lambda t: _delta(t, finish=True)),
    st.just(_USAGE),
    st.sampled_from([": keep-alive\n\n", "event: message\n" + _delta("e"), "data: {not json\n\n",
                     'data: {"error": {"message": "boom"}}\n\n', "data: [1, 2]\n\n", "id: 4\n\n"]),
)


@st.composite
def _streams(draw: Any) -> tuple[list[bytes], str, str, bool, bool]:
    """(upstream reads, how the upstream ends, what the client does, include_usage, drop_cached)."""
    events = draw(st.lists(st.one_of(_TEXT.map(_delta), _EVENT), min_size=1, max_size=12))
    done = draw(st.booleans()) or draw(st.booleans())
    raw = ("".join(events) + ("data: [DONE]\n\n" if done else "")).encode()
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(raw) - 1)), max_size=8))))
    reads = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)]) if raw[a:b]]
    upstream = draw(st.sampled_from(["eof", "eof", "eof", "reset", "stall"]))
    client = draw(st.sampled_from(["reads", "reads", "reads", "stalls"]))
    return reads, upstream, client, draw(st.booleans()), draw(st.booleans())


async def _relay(reads: list[bytes], upstream_end: str, client: str, include_usage: bool, drop_cached: bool,
                 old: bool) -> dict[str, Any]:
    """One streamed answer relayed by :func:`stream_response` under the inference routes' send chain; ``old``:
    the reference (coded read path, every part through the routes' wrapper)."""
    loop = asyncio.get_running_loop()
    conn = _Conn()
    resp = UpstreamResponse(conn, loop)
    resp.status, resp._head_seen = 200, True
    up = UpstreamStream(resp, reads[0], None, _PassCoding() if old else IDENTITY)  # type: ignore[arg-type]
    log: list[Any] = []
    held = SimpleNamespace(up=up, attempt=SimpleNamespace(succeeded=lambda: log.append("succeeded")),
                           cpu=SimpleNamespace(budget=None), drop_cached=drop_cached, started=False, progress=None,
                           usage=None, relayed=None)
    rec = SimpleNamespace(outcome=None, status=None, error_code=None, relayed_output=None, request_id="r-1")
    req = SimpleNamespace(include_usage=include_usage, dropped=(0, ""))
    failures = SimpleNamespace(failed=lambda attempt, f: log.append(("failed", f.kind, str(f))))
    response = stream_response(req, rec, held, BOUND_S if upstream_end == "stall" else 30.0,  # type: ignore[arg-type]
                               failures, lambda: log.append("end"))  # type: ignore[arg-type]
    sent: list[Any] = []
    never: asyncio.Future[None] = loop.create_future()

    async def server_send(message: Any) -> None:
        if client == "stalls" and len(sent) >= 2:
            await never  # the client stopped reading: the server's send waits for ever
        sent.append((message["type"], message.get("body"), message.get("more_body"), message.get("status")))

    framed = SimpleNamespace(complete=True)
    routes_send = _sender(framed, server_send, lambda: sent.append("hand-off"))  # type: ignore[arg-type]
    bounded = StallBoundedSend(routes_send, BOUND_S if client == "stalls" else 30.0,
                               body_send=None if old else server_send)

    async def feed() -> None:
        for piece in reads[1:]:
            while resp._waiter is None:  # one upstream read per piece: fed once the relay waits
                await asyncio.sleep(0)
            resp._feed(piece)
        while resp._waiter is None and not resp._closed:
            await asyncio.sleep(0)
        if upstream_end == "eof":
            resp._finish()
        elif upstream_end == "reset":
            resp._fail(UpstreamConnectionLost("replica connection ended by ConnectionResetError", True))

    async def receive() -> Any:
        await loop.create_future()

    feeder = asyncio.ensure_future(feed())
    try:
        await response({"type": "http", "asgi": {"spec_version": "2.3"}}, receive, bounded)
        ended = "returned"
    except WriteStall as exc:
        ended = f"stall {exc.code}"
    finally:
        bounded.close()
        feeder.cancel()
        held.up.close()
    return {"sent": sent, "log": log, "ended": ended, "aborted": conn.aborted,
            "rec": vars(rec), "held": {k: v for k, v in vars(held).items() if k in ("started", "progress", "usage",
                                                                                   "relayed")}}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_streams())
def test_the_relay_sends_and_records_what_the_old_relay_did(case: tuple[list[bytes], str, str, bool, bool]) -> None:
    reads, upstream_end, client, include_usage, drop_cached = case

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        new = await asyncio.ensure_future(_relay(reads, upstream_end, client, include_usage, drop_cached, False))
        old = await asyncio.ensure_future(_relay(reads, upstream_end, client, include_usage, drop_cached, True))
        return new, old

    new, old = asyncio.run(both())
    assert new == old


def test_an_upstream_that_stalls_mid_stream_ends_it_with_upstream_timeout() -> None:
    """The new read bound fires (not only the same as the old one): the client gets the events before the
    stall, then the ``upstream_timeout`` error event; the replica's attempt is failed."""
    reads = [_delta("a").encode(), _delta("b").encode()]
    out = asyncio.run(_relay(reads, "stall", "reads", False, False, False))
    bodies = [m[1] for m in out["sent"] if m != "hand-off" and m[0] == "http.response.body"]
    assert b"".join(bodies).startswith(reads[0] + reads[1])
    assert b'"code": "upstream_timeout"' in b"".join(bodies)
    assert out["rec"]["error_code"] == "upstream_timeout" and out["rec"]["outcome"] == "failed"
    assert ("failed", "protocol", "") in out["log"]


async def test_the_read_bound_counts_each_wait_not_the_whole_stream() -> None:
    """Reads each waiting less than the bound never time out, however long the stream; one wait past it does."""
    loop = asyncio.get_running_loop()
    resp = UpstreamResponse(_Conn(), loop)
    # each wait 0.05 s against a 0.6 s bound (session 30, flake30: it was 0.2 s, and a loop stalled 0.15 s by a
    # full GC collection or the scheduler fired the bound although the chunk was due)
    resp.bound_reads(0.6)

    async def feed(n: int) -> None:
        for i in range(n):
            await asyncio.sleep(0.05)
            resp._feed(b"%d" % i)

    feeder = asyncio.ensure_future(feed(16))  # 0.8 s in all: past the bound
    got = [await resp.read_chunk() for _ in range(16)]
    await feeder
    assert got == [b"%d" % i for i in range(16)]
    with pytest.raises(TimeoutError):
        await resp.read_chunk()
    assert not asyncio.current_task().cancelling()  # type: ignore[union-attr]
    resp._feed(b"late")
    assert await resp.read_chunk() == b"late"  # a timed-out read leaves the answer readable (the caller ends it)
    resp.close()
    assert resp._read_timer is None


async def test_a_whole_or_closed_answer_keeps_no_timer() -> None:
    loop = asyncio.get_running_loop()
    for end in ("finish", "fail", "close"):
        resp = UpstreamResponse(_Conn(), loop)
        resp.bound_reads(30.0)
        reader = asyncio.ensure_future(resp.read_chunk())
        while resp._waiter is None:
            await asyncio.sleep(0)
        assert resp._read_timer is not None
        if end == "finish":
            resp._finish()
            assert await reader == b""
        elif end == "fail":
            resp._fail(UpstreamConnectionLost("gone", True))
            with pytest.raises(UpstreamConnectionLost):
                await reader
        else:
            resp.close()
            reader.cancel()
        assert resp._read_timer is None


def test_bound_must_be_positive() -> None:
    with pytest.raises(ValueError):
        UpstreamResponse(_Conn()).bound_reads(0)


def test_no_shape_is_learnt_from_a_finish_event() -> None:
    """A stream's delta shape stays the one of its deltas after the finish event (one parse and probe less per
    stream); the counts are those of a scanner that never learns."""
    events = [_delta("first"), *[_delta(f" w{i}") for i in range(4)], _delta(" end", finish=True), _USAGE,
              "data: [DONE]\n\n"]
    learning, plain = SseScanner(keep_usage_chunk=False), SseScanner(keep_usage_chunk=False, shapes=False)
    shapes = []
    for e in events:
        assert learning.feed(e.encode()) == plain.feed(e.encode())
        shapes.append(learning._shape)
    assert shapes[-1] is shapes[2] is not None  # learnt at the second data event, kept after the finish
    assert (learning.events, learning.output_tokens, learning.usage) == (plain.events, plain.output_tokens,
                                                                        plain.usage)


async def test_a_send_that_waits_continues_under_the_bound_and_one_that_does_not_arms_none() -> None:
    """StallBoundedSend takes a send's first step itself (session 24): one that returns there arms no timer;
    one that waits is resumed where it stopped, gets its values and errors through, and is still ended by
    the stall bound; a cancellation from elsewhere reaches the waiting send unchanged."""
    loop = asyncio.get_running_loop()
    log: list[Any] = []
    gate: asyncio.Future[str] = loop.create_future()

    async def server_send(message: Any) -> None:
        if message.get("wait") == "gate":
            log.append(await gate)
        elif message.get("wait") == "forever":
            try:
                await loop.create_future()
            except asyncio.CancelledError:
                log.append("send cancelled")
                raise
        elif message.get("wait") == "raise":
            await asyncio.sleep(0)
            raise ConnectionResetError("gone")
        elif message.get("wait") == "raise-first":
            raise OSError("first step")
        log.append(message["body"])

    bounded = StallBoundedSend(server_send, 0.05)
    await bounded({"type": "http.response.body", "body": b"a", "more_body": True})
    assert bounded.deadline._handle is None  # returned in its first step: no bound armed
    task = asyncio.ensure_future(bounded({"type": "http.response.body", "body": b"b", "wait": "gate"}))
    await asyncio.sleep(0)
    gate.set_result("opened")
    await task
    assert log == [b"a", "opened", b"b"]
    with pytest.raises(ConnectionResetError):
        await bounded({"type": "http.response.body", "body": b"c", "wait": "raise"})
    with pytest.raises(OSError, match="first step"):
        await bounded({"type": "http.response.body", "body": b"d", "wait": "raise-first"})
    other = asyncio.ensure_future(bounded({"type": "http.response.body", "body": b"e", "wait": "forever"}))
    await asyncio.sleep(0.01)
    other.cancel()
    with pytest.raises(asyncio.CancelledError):
        await other
    assert log[-1] == "send cancelled"

    async def stalled() -> str:
        try:
            await StallBoundedSend(server_send, 0.05)({"type": "http.response.body", "body": b"f", "wait": "forever"})
        except WriteStall as exc:
            return exc.code
        return "not ended"

    assert await asyncio.ensure_future(stalled()) == "client_write_stall"
    assert log[-1] == "send cancelled"
    bounded.close()
