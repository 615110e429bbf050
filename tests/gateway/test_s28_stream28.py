"""Session 28 (issue 14), helper stream28: a live stream's middle parts leave the server connection at once
(``CoalescingTransport.write_through``, turned on and off by the relay through the scope's ``ConnectionLoss``)
instead of at the end of their loop step: one ``call_soon`` callback and one loop iteration less per SSE event.

- The transport: while on, a write leaves at once, with anything held before it in one write, in order; a
  closing transport still gets nothing; off holds writes to the end of the step again.
- The relay (differential, hypothesis, the streams of tests/gateway/test_s24_relay.py: deltas, finish and
  usage events, bad JSON, error events, comments, a missing ``[DONE]``, cut anywhere into reads; clean, reset
  or stalled upstreams): the client's wire bytes (uvicorn's chunked framing written to the transport), the
  record, usage, relayed count and breaker verdict are those of the relay without write-through, and the
  connection's write-through is off once the stream ended, however it ended (client gone too).
- Where it applies: the first part leaves with the head, each middle part in its own step at once (nothing
  left for the end of the step), the part holding ``[DONE]`` with the chunked terminator."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hypothesis import HealthCheck, given, settings

from gateway.client_io import LOSS_KEY, ConnectionLoss
from gateway.coalesce import CoalescingTransport
from gateway.inference_asgi import _sender
from gateway.pipeline_answer import stream_response
from gateway.proxy import UpstreamStream
from gateway.upstream_conn import UpstreamConnectionLost
from gateway.upstream_response import UpstreamResponse
from gateway.write_stall import StallBoundedSend
from tests.gateway.test_s24_relay import _USAGE, _Conn, _delta, _streams
from tests.gateway.test_s4_coalesce import _Transport

HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"


async def _relay(reads: list[bytes], upstream_end: str, through: bool, *, leave_after: int | None = None,
                 steps: list[Any] | None = None, one_per_read: bool = False) -> dict[str, Any]:
    """One stream relayed by :func:`stream_response` to a :class:`CoalescingTransport` over a recording
    transport, the server's ``send`` writing as uvicorn's chunked framing does; ``through``: the scope's
    ``ConnectionLoss`` carries the transport's write-through switch (else none, as before session 28).
    ``leave_after``: the client leaves (the task is cancelled) once that many body parts were sent.
    ``steps``: appended per body part: whether the coalescer still holds bytes for the end of the step.
    ``one_per_read``: each piece is read alone (fed once the previous one was taken), as events apart in time."""
    loop = asyncio.get_running_loop()
    raw = _Transport()
    wire = CoalescingTransport(raw, loop)  # type: ignore[arg-type]
    loss = ConnectionLoss()
    if through:
        loss.write_through = wire.write_through
    resp = UpstreamResponse(_Conn(), loop)
    resp.status, resp._head_seen = 200, True
    up = UpstreamStream(resp, reads[0], None)
    log: list[Any] = []
    held = SimpleNamespace(up=up, attempt=SimpleNamespace(succeeded=lambda: log.append("succeeded")),
                           cpu=SimpleNamespace(budget=None), drop_cached=True, started=False, progress=None,
                           usage=None, relayed=None)
    rec = SimpleNamespace(outcome=None, status=None, error_code=None, relayed_output=None, request_id="r-1")
    req = SimpleNamespace(include_usage=False, dropped=(0, ""))
    failures = SimpleNamespace(failed=lambda attempt, f: log.append(("failed", f.kind, str(f))))
    response = stream_response(req, rec, held, 0.03 if upstream_end == "stall" else 30.0,  # type: ignore[arg-type]
                               failures, lambda: log.append("end"))  # type: ignore[arg-type]
    parts = [0]
    task = asyncio.current_task()

    async def server_send(message: Any) -> None:  # uvicorn's httptools send, chunked
        if message["type"] == "http.response.start":
            wire.write(HEAD)
            return
        body, more = message.get("body", b""), message.get("more_body", False)
        wire.write((b"%x\r\n" % len(body) + body + b"\r\n" if body else b"") + (b"" if more else b"0\r\n\r\n"))
        if steps is not None:
            steps.append(bool(wire._pending))
        parts[0] += 1
        if leave_after is not None and parts[0] >= leave_after:
            loop.call_soon(task.cancel)  # type: ignore[union-attr]

    routes_send = _sender(SimpleNamespace(complete=True), server_send, lambda: None)  # type: ignore[arg-type]
    bounded = StallBoundedSend(routes_send, 30.0, body_send=server_send)

    async def feed() -> None:
        for piece in reads[1:]:
            while resp._waiter is None:  # one upstream read per piece, once the relay waits
                await asyncio.sleep(0)
            resp._feed(piece)
            while one_per_read and resp._chunks and not resp._closed:
                await asyncio.sleep(0)
        while resp._waiter is None and not resp._closed:
            await asyncio.sleep(0)
        if upstream_end == "eof":
            resp._finish()
        elif upstream_end == "reset":
            resp._fail(UpstreamConnectionLost("replica connection ended by ConnectionResetError", True))

    async def receive() -> Any:
        await loop.create_future()

    feeder = asyncio.ensure_future(feed())
    ended = "returned"
    try:
        await response({"type": "http", "asgi": {"spec_version": "2.3"}, LOSS_KEY: loss}, receive, bounded)
    except asyncio.CancelledError:
        ended = "client left"
        task.uncancel()  # type: ignore[union-attr]
    finally:
        bounded.close()
        feeder.cancel()
        held.up.close()
    wire.flush()
    return {"wire": b"".join(raw.writes), "writes": raw.writes, "log": log, "ended": ended, "through": wire._through,
            "rec": vars(rec), "held": {k: v for k, v in vars(held).items() if k in ("started", "progress", "usage",
                                                                                   "relayed")}}


async def _step() -> None:
    """Let the loop run the end-of-step callbacks queued so far."""
    await asyncio.sleep(0)
    await asyncio.sleep(0)


async def test_write_through_writes_at_once_with_what_is_held_and_off_holds_again() -> None:
    raw = _Transport()
    wire = CoalescingTransport(raw, asyncio.get_running_loop())  # type: ignore[arg-type]
    wire.write(b"head")
    wire.write_through(True)
    assert raw.writes == []  # what was held stays held until a write (or the end of the step)
    wire.write(b"one")
    assert raw.writes == [b"headone"] and wire._scheduled is None and wire.get_write_buffer_size() == 7
    wire.write(b"two")
    assert raw.writes == [b"headone", b"two"] and wire._scheduled is None
    raw.closing = True
    wire.write(b"lost")  # a closing transport gets nothing, as before
    raw.closing = False
    wire.write_through(False)
    wire.write(b"three")
    wire.write(b"four")
    assert raw.writes == [b"headone", b"two"] and wire._scheduled is not None
    await _step()
    assert raw.writes == [b"headone", b"two", b"threefour"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=_streams())
def test_the_client_gets_the_same_bytes_and_the_record_is_the_same(case: tuple[list[bytes], str, str, bool,
                                                                                bool]) -> None:
    reads, upstream_end, _, _, _ = case

    async def both() -> tuple[dict[str, Any], dict[str, Any]]:
        new = await asyncio.ensure_future(_relay(reads, upstream_end, True))
        old = await asyncio.ensure_future(_relay(reads, upstream_end, False))
        return new, old

    new, old = asyncio.run(both())
    assert new["through"] is False  # the connection's next answer is coalesced again
    assert new["wire"] == old["wire"]
    assert {k: v for k, v in new.items() if k not in ("writes", "wire")} == {
        k: v for k, v in old.items() if k not in ("writes", "wire")}


def test_middle_parts_leave_at_once_and_the_done_part_with_the_terminator() -> None:
    events = [_delta("first"), *[_delta(f" w{i}") for i in range(4)], _delta(" end", finish=True),
              _USAGE + "data: [DONE]\n\n"]
    reads = [e.encode() for e in events]
    steps: list[Any] = []
    out = asyncio.run(_relay(reads, "eof", True, steps=steps, one_per_read=True))
    old = asyncio.run(_relay(reads, "eof", False, one_per_read=True))
    assert out["wire"] == old["wire"] and out["ended"] == "returned" and out["through"] is False
    assert out["rec"]["outcome"] == "allowed" and out["held"]["relayed"] == old["held"]["relayed"] == 6
    assert out["held"]["usage"]["prompt_tokens_details"] == {"cached_tokens": 3}  # the gateway keeps it
    # the first part is held for the head's write; each middle part left at once; the [DONE] part is held
    assert steps[0] is True and steps[1:6] == [False] * 5 and steps[6] is True
    assert out["writes"][0].startswith(HEAD) and out["writes"][0].endswith(b"first\",\"logprobs\":null,\"finish_reason\":null}],\"usage\":null}\n\n\r\n")
    # the [DONE] part waited for the end of its step (here the upstream's end came later: the terminator alone)
    assert out["writes"][-2].endswith(b"data: [DONE]\n\n\r\n") and out["writes"][-1] == b"0\r\n\r\n"
    assert b"cached_tokens" not in out["wire"]  # drop_cached: the usage event went out without it
    assert len(out["writes"]) == len(old["writes"]) == 8  # as many writes: none was saved by holding a middle part


def test_a_client_that_leaves_mid_stream_leaves_the_connection_coalescing() -> None:
    reads = [_delta(f" w{i}").encode() for i in range(6)] + [b"data: [DONE]\n\n"]
    out = asyncio.run(_relay(reads, "eof", True, leave_after=3, one_per_read=True))
    old = asyncio.run(_relay(reads, "eof", False, leave_after=3, one_per_read=True))
    assert out["ended"] == old["ended"] == "client left"
    assert out["through"] is False
    assert out["wire"] == old["wire"] and out["rec"] == old["rec"] and out["rec"]["status"] == 499
    assert out["held"] == old["held"]


def test_a_broken_stream_sends_its_error_event_with_the_terminator() -> None:
    reads = [_delta(" a").encode(), _delta(" b").encode(), _delta(" c").encode(), b"data: {not json\n\n"]
    steps: list[Any] = []
    out = asyncio.run(_relay(reads, "eof", True, steps=steps, one_per_read=True))
    old = asyncio.run(_relay(reads, "eof", False, one_per_read=True))
    assert out["wire"] == old["wire"] and out["rec"] == old["rec"]
    assert out["rec"]["error_code"] == "upstream_stream_error" and out["through"] is False
    assert steps[-1] is True  # the error event is held for the terminator's write
    assert out["writes"][-1].endswith(b"0\r\n\r\n") and b"upstream_stream_error" in out["writes"][-1]


async def test_the_guarded_listener_hands_each_request_its_connections_write_through(monkeypatch: Any) -> None:
    """Wiring (gateway/head_guard.py): a request scope's ``ConnectionLoss.write_through`` is the switch of its
    connection's coalescing transport; on, a body part leaves by the time uvicorn's send returns; the next answer
    on the keep-alive connection is coalesced again once it is off."""
    import gateway.head_guard as head_guard
    from gateway.server import uvicorn_config
    from tests.support.listeners import serving

    transports: list[CoalescingTransport] = []

    class Spy(CoalescingTransport):
        __slots__ = ()

        def __init__(self, *a: Any) -> None:
            super().__init__(*a)
            transports.append(self)

    monkeypatch.setattr(head_guard, "CoalescingTransport", Spy)
    held_after_send: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        loss = scope[LOSS_KEY]
        assert loss.write_through.__self__ is transports[-1]
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        held_after_send.append(bool(transports[-1]._pending))
        loss.write_through(True)
        for part in (b"data: 2\n\n", b"data: 3\n\n"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
            held_after_send.append(bool(transports[-1]._pending))
        loss.write_through(False)
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": True})
        held_after_send.append(bool(transports[-1]._pending))
        await send({"type": "http.response.body", "body": b""})

    async with serving() as serve:
        host, port = await serve(uvicorn_config(app, "127.0.0.1", 0, http="httptools"))
        reader, writer = await asyncio.open_connection(host, port)
        for _ in range(2):  # keep-alive: the second answer is held per step as the first one's start was
            writer.write(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200") and b"data: 2\n\n" in body and b"data: [DONE]\n\n" in body
        writer.close()
    assert len(transports) == 1 and not transports[0]._through
    assert held_after_send == [True, False, False, True] * 2


def _sim_stream(chat: bool, texts: list[str]) -> bytes:
    """The simulator's own SSE answer (``sim.replica``'s shapes): deltas, the finish, the usage event, ``[DONE]``."""
    from sim.replica import _Shapes, _usage

    shapes = _Shapes(SimpleNamespace(endpoint="chat" if chat else "completions", model="sim-model", stream=True,
                                     include_usage=True))  # type: ignore[arg-type]
    events = [shapes.chunk(t, i == 0, i == len(texts) - 1) for i, t in enumerate(texts)]
    events.append(shapes.usage_chunk(_usage(70, len(texts), 16)))
    return ("".join(events) + "data: [DONE]\n\n").encode()


def _openai_chat_stream(texts: list[str]) -> bytes:
    """An OpenAI-style chat stream: a role event with empty content, content deltas (with a system fingerprint),
    a finish event with an empty delta, a usage event without choices, ``[DONE]``."""
    import json

    def ev(delta: dict[str, Any], finish: str | None = None) -> str:
        return "data: " + json.dumps({"id": "chatcmpl-AbC", "object": "chat.completion.chunk", "created": 1733,
                                      "model": "gpt-4o-2024-08-06", "system_fingerprint": "fp_50cad350e4",
                                      "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                   "finish_reason": finish}], "usage": None},
                                     separators=(",", ":")) + "\n\n"

    events = [ev({"role": "assistant", "content": "", "refusal": None})] + [ev({"content": t}) for t in texts]
    events.append(ev({}, "stop"))
    events.append("data: " + json.dumps({"id": "chatcmpl-AbC", "object": "chat.completion.chunk", "created": 1733,
                                         "model": "gpt-4o-2024-08-06", "choices": [], "usage": {
                                             "prompt_tokens": 9, "completion_tokens": len(texts), "total_tokens":
                                             9 + len(texts), "prompt_tokens_details": {"cached_tokens": 0}}},
                                        separators=(",", ":")) + "\n\n")
    return ("".join(events) + "data: [DONE]\n\n").encode()


def _reads(raw: bytes, how: str) -> list[bytes]:
    """``raw`` cut into upstream reads: one event a read, all at once, each event in two, fixed sizes, or the
    last events with ``[DONE]`` cut inside it."""
    events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
    if how == "event":
        return events
    if how == "whole":
        return [raw]
    if how == "halves":
        return [p for e in events for p in (e[:len(e) // 2], e[len(e) // 2:])]
    if how.startswith("size"):
        n = int(how[4:])
        return [raw[i:i + n] for i in range(0, len(raw), n)]
    assert how == "done-split"
    cut = len(raw) - len(b"NE]\n\n")
    return [raw[:len(raw) // 3], raw[len(raw) // 3:cut], raw[cut:]]


def test_the_byte_scan_counts_what_the_parse_counts_on_sim_and_openai_streams(monkeypatch: Any) -> None:
    """The learnt-shape read (no JSON parse of a delta) gives the same forwarded bytes, event count, output-token
    count, usage and ``[DONE]`` as a scanner that parses every event, on the simulator's completions and chat
    streams and an OpenAI-style chat stream, read one event a read, several a read, split inside events, and with
    ``[DONE]`` split; the count is the number of deltas with text; read one event a read (events apart in time),
    most events are read without a parse."""
    from gateway import json_fast
    from gateway.sse import SseScanner

    texts = ["Hello", *[f" tok{i}" for i in range(30)], "", " é 中", ' "quoted"', " end"]
    parses = [0]
    loads = json_fast.loads

    def counting(data: Any) -> Any:
        parses[0] += 1
        return loads(data)

    monkeypatch.setattr(json_fast, "loads", counting)
    streams = {"sim-completions": _sim_stream(False, texts), "sim-chat": _sim_stream(True, texts),
               "openai-chat": _openai_chat_stream(texts)}
    for name, raw in streams.items():
        for how in ("event", "whole", "halves", "size7", "size200", "done-split"):
            for drop in (False, True):
                got = []
                for shapes in (True, False):
                    parses[0] = 0
                    scanner = SseScanner(keep_usage_chunk=True, drop_cached=drop, shapes=shapes)
                    out = b"".join(scanner.feed(r) for r in _reads(raw, how)) + scanner.finish()
                    got.append((out, scanner.events, scanner.output_tokens, scanner.usage, scanner.done, parses[0]))
                fast, parsed = got
                assert fast[:5] == parsed[:5], (name, how, drop)
                assert fast[2] == sum(1 for t in texts if t), (name, how, drop)  # one per delta with text
                assert fast[4] is True and fast[3]["completion_tokens"] == len(texts)
                if not drop:
                    assert fast[0] == raw  # forwarded byte for byte
                if how == "event":  # whole events at the start of each read: read by shape once learnt
                    assert fast[5] < parsed[5] // 4, (name, how, drop, fast[5], parsed[5])


def test_after_an_event_split_across_reads_the_whole_events_of_a_read_are_read_by_shape(monkeypatch: Any) -> None:
    """Session 28 (``SseScanner._feed_split``): a read that completes the event buffered from the last read and
    then holds whole delta events reads those by the learnt shape (before: every event of every such read was
    parsed, so reads not cut at event boundaries lost the shape for the whole stream). Same outcome as the parse."""
    from gateway import json_fast
    from gateway.sse import SseScanner

    texts = ["Hello", *[f" tok{i}" for i in range(200)], " end"]
    parses = [0]
    loads = json_fast.loads

    def counting(data: Any) -> Any:
        parses[0] += 1
        return loads(data)

    monkeypatch.setattr(json_fast, "loads", counting)
    for raw in (_sim_stream(False, texts), _sim_stream(True, texts), _openai_chat_stream(texts)):
        reads = _reads(raw, "size4096")  # ~13 events a read, each read cut inside an event
        got = []
        for shapes in (True, False):
            parses[0] = 0
            scanner = SseScanner(keep_usage_chunk=False, drop_cached=True, shapes=shapes)
            out = b"".join(scanner.feed(r) for r in reads) + scanner.finish()
            got.append((out, scanner.events, scanner.output_tokens, scanner.usage, scanner.done, parses[0]))
        assert got[0][:5] == got[1][:5] and got[0][2] == len(texts)
        assert got[1][5] == got[1][1] > 200  # the reference parses every data event
        # the first read's events (before any shape), then about one parse a read (the split event), probes, usage
        assert got[0][5] < got[1][5] // 4


def test_a_bad_event_after_a_split_one_fails_as_the_parse_does() -> None:
    """The error of a bad event in a read that completes a split event: the same message, the same events
    forwarded before it (the completed one and the good deltas), the same scanner state as without the shape."""
    from tests.gateway.test_s21_shapereview import _run

    events = [_delta(f" w{i}").encode() for i in range(4)]
    bad = b"data: {not json\n\n"
    for tail in (bad, b"data: " + b"x" * 300 + b"\n\n"):
        raw = b"".join(events) + events[0] + tail
        cut = len(b"".join(events[:3])) + 20  # inside the fourth event
        chunks = [raw[:cut], raw[cut:]]
        for limit in (1 << 20, 200):
            for drop in (False, True):
                assert _run(chunks, False, drop, limit, True) == _run(chunks, False, drop, limit, False)
    with_shape = _run([b"".join(events)[:len(b"".join(events)) - 30], b"".join(events)[-30:] + events[0] + bad],
                      False, False, 1 << 20, True)
    assert with_shape[-2][0] == "error" and with_shape[-2][2].endswith(events[0])  # forwarded: up to the bad one
