"""Session 16, S15-3: with ``drop_cached``, the SSE scanner's LF fast path (``SseScanner._feed_lf``)
searches a read once for the counter's name and a ``\\u`` escape; when the read names neither, its
events skip their own searches (``event_for_drop``), with the same outcome: several events per read,
one of them naming the counter (top level, nested, escaped, duplicated), go out exactly as the
general path sends them, and a read naming the counter still has each of its events searched."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gateway.sse as sse
from gateway.sse import SseProtocolError, SseScanner

_DELTA = json.dumps({"choices": [{"index": 0, "delta": {"content": "hi"}}]})
_COUNTER_TOP = json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2,
                                                    "prompt_tokens_details": {"cached_tokens": 2}}})
_COUNTER_NESTED = json.dumps({"choices": [{"index": 0, "delta": {"content": "x"},
                                           "usage": {"prompt_tokens_details": {"cached_tokens": 5}}}]})
_COUNTER_ESCAPED = '{"choices": [], "usage": {"prompt_tokens_details": {"cached\\u005ftokens": 4}}}'
_COUNTER_DUPLICATE = ('{"choices": [], "usage": {"prompt_tokens_details": {"cached_tokens": 9}}, '
                      '"usage": {"prompt_tokens": 3}}')
_PAYLOADS = st.sampled_from([
    _DELTA, _COUNTER_TOP, _COUNTER_NESTED, _COUNTER_ESCAPED, _COUNTER_DUPLICATE,
    json.dumps({"choices": [{"index": 0, "text": " w"}], "usage": None}),
    json.dumps({"choices": [{"index": 0, "delta": {"content": "a \\ b"}}]}),  # a backslash, no escape u
    json.dumps({"choices": [{"index": 0, "delta": {"content": "cached_tokens"}}]}),  # the name, unquoted
    "[DONE]", "", "not json",
])
_LINE = st.one_of(
    _PAYLOADS.map(lambda p: "data: " + p),
    _PAYLOADS.map(lambda p: "data:" + p),
    st.sampled_from([": keep-alive", ": cached", "event: message", "id: 7", "x-cached: 1"]),
)
_EVENT = st.lists(_LINE, min_size=1, max_size=2).map(lambda ls: "".join(x + "\n" for x in ls) + "\n")
_STATE = ("usage", "done", "events", "output_tokens", "_buf", "_pos", "_data", "_cr_end", "_started")


def _step(scanner: SseScanner, chunk: bytes, general: bool) -> tuple[str, bytes]:
    try:
        return "ok", (scanner._feed_general(chunk) if general else scanner.feed(chunk))
    except SseProtocolError as exc:
        return f"error {exc}", exc.forward


def _state(scanner: SseScanner) -> tuple[Any, ...]:
    return tuple(bytes(v) if isinstance(v, bytearray) else v for v in (getattr(scanner, n) for n in _STATE))


@settings(max_examples=500, deadline=None)
@given(reads=st.lists(st.lists(_EVENT, min_size=1, max_size=4).map("".join), min_size=1, max_size=5),
       keep=st.booleans())
def test_several_events_per_read_forward_as_the_general_path(reads: list[str], keep: bool) -> None:
    fast = SseScanner(keep_usage_chunk=keep, drop_cached=True)
    ref = SseScanner(keep_usage_chunk=keep, drop_cached=True)
    for text in ["data: " + _DELTA + "\n\n", *reads]:  # the first read starts the stream (BOM check)
        chunk = text.encode()
        a, b = _step(fast, chunk, False), _step(ref, chunk, True)
        assert a == b
        assert _state(fast) == _state(ref)
        if a[0] != "ok":
            return
        assert not any(_names_counter(orjson.loads(d)) for d in _data(a[1]))  # a key, at any depth


def _data(out: bytes) -> list[bytes]:
    return [line[5:].strip() for line in out.split(b"\n") if line.startswith(b"data:") and line[5:].strip()
            not in (b"[DONE]", b"")]


def _names_counter(value: Any) -> bool:
    if isinstance(value, dict):
        return "cached_tokens" in value or any(_names_counter(v) for v in value.values())
    if isinstance(value, list):
        return any(_names_counter(v) for v in value)
    return False


def _events(out: bytes) -> list[bytes]:
    return [e for e in out.split(b"\n\n") if e]


def test_a_read_of_several_events_one_naming_the_counter() -> None:
    s = SseScanner(keep_usage_chunk=True, drop_cached=True)
    assert s.feed(b"data: " + _DELTA.encode() + b"\n\n") == b"data: " + _DELTA.encode() + b"\n\n"
    chunk = b"".join(b"data: " + p.encode() + b"\n\n" for p in (_DELTA, _COUNTER_NESTED, _DELTA, _COUNTER_TOP))
    out = s.feed(chunk)
    events = _events(out)
    assert len(events) == 4
    assert events[0] == events[2] == b"data: " + _DELTA.encode()  # byte for byte
    assert orjson.loads(events[1][len(b"data: "):]) == {"choices": [{"index": 0, "delta": {"content": "x"}, "usage": {}}]}
    assert orjson.loads(events[3][len(b"data: "):]) == {"choices": [], "usage": {"prompt_tokens": 3,
                                                                                 "completion_tokens": 2}}
    assert b"cached_tokens" not in out
    assert s.usage == {"prompt_tokens": 3, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 2}}
    assert s.output_tokens == 1 + 3  # the first read's delta, then two deltas and the nested copy's delta


@pytest.mark.parametrize(("payloads", "searched"), [
    ((_DELTA, _DELTA, _DELTA), 0),  # the read names nothing: its events are not searched again
    ((_DELTA, _COUNTER_ESCAPED, _DELTA), 3),  # an escape in the read: every event searched
    ((_DELTA, _DELTA, _COUNTER_TOP), 3),
])
def test_the_read_is_searched_once(monkeypatch: pytest.MonkeyPatch, payloads: tuple[str, ...], searched: int) -> None:
    calls: list[bytes] = []
    real = sse.event_for_drop

    def counting(payload: bytes, obj: dict[str, Any], usage: Any = None) -> bytes | None:
        calls.append(payload)
        return real(payload, obj, usage)

    s = SseScanner(keep_usage_chunk=True, drop_cached=True)
    s.feed(b": start\n\n")
    monkeypatch.setattr(sse, "event_for_drop", counting)
    out = s.feed(b"".join(b"data: " + p.encode() + b"\n\n" for p in payloads))
    assert len(calls) == searched
    assert b'"cached_tokens"' not in out and b"\\u" not in out
    assert len(_events(out)) == len(payloads)


def test_pass_tenant_is_not_searched(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    monkeypatch.setattr(sse, "may_name_cached", lambda data: calls.append(data) or True)
    s = SseScanner(keep_usage_chunk=True, drop_cached=False)
    s.feed(b": start\n\n")
    chunk = b"data: " + _COUNTER_TOP.encode() + b"\n\n"
    assert s.feed(chunk) == chunk  # a pass tenant gets the replica's bytes
    assert calls == []
