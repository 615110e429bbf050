"""Issue 14, session 9: the SSE scanner's LF-only fast path (``SseScanner._feed_lf``) is the general
path (``_feed_general``) on every stream: same bytes forwarded per chunk, same errors (and their
``forward``), same state after each chunk and the same end (differential, hypothesis)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sse import SseProtocolError, SseScanner

_STATE = ("usage", "done", "events", "output_tokens", "_buf", "_pos", "_data", "_cr_end", "_cr_dispatched",
          "_started")

_PAYLOADS = st.sampled_from([
    json.dumps({"choices": [{"index": 0, "delta": {"content": "hi"}}]}),
    json.dumps({"choices": [{"index": 0, "text": " w"}], "usage": None}),
    json.dumps({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}),
    json.dumps({"choices": [{"delta": {}}, {"delta": {"tool_calls": [1]}}]}),
    "[DONE]", "", "not json", "[1, 2]", json.dumps({"error": {"message": "x"}}),
])
_LINE = st.one_of(
    _PAYLOADS.map(lambda p: "data: " + p),
    _PAYLOADS.map(lambda p: "data:" + p),
    st.sampled_from([": keep-alive", ":", "event: message", "id: 7", "retry: 10", "data", "data:  x", "dat: y"]),
)
_EVENT = st.lists(_LINE, min_size=0, max_size=3).map(lambda ls: "".join(x + "\n" for x in ls) + "\n")


@st.composite
def _streams(draw: Any) -> tuple[list[bytes], int]:
    events = draw(st.lists(_EVENT, min_size=1, max_size=8))
    text = "".join(events)
    if draw(st.booleans()):  # sometimes other line ends, a BOM, trailing bytes
        eol = draw(st.sampled_from(["\r\n", "\r"]))
        idx = draw(st.integers(0, max(0, text.count("\n") - 1)))
        parts = text.split("\n")
        text = "\n".join(parts[:idx]) + (eol if idx < len(parts) - 1 else "") + "\n".join(parts[idx + 1:]) \
            if len(parts) > 1 else text
    raw = (b"\xef\xbb\xbf" if draw(st.booleans()) else b"") + text.encode() + draw(st.sampled_from([b"", b"\n", b"data"]))
    bounds = [i + 1 for i in range(len(raw)) if raw[i:i + 1] == b"\n"]  # cuts after an LF: fast path chances
    cuts = sorted(set(draw(st.lists(st.one_of(st.integers(0, len(raw)), st.sampled_from(bounds or [0])),
                                    max_size=6))))
    chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
    return chunks, draw(st.sampled_from([1 << 20, 64, 16]))


def _step(scanner: SseScanner, chunk: bytes, general: bool) -> tuple[str, bytes]:
    try:
        return "ok", (scanner._feed_general(chunk) if general else scanner.feed(chunk))
    except SseProtocolError as exc:
        return f"error {exc}", exc.forward


def _state(scanner: SseScanner) -> tuple[Any, ...]:
    return tuple(bytes(v) if isinstance(v, bytearray) else v for v in (getattr(scanner, n) for n in _STATE))


@settings(max_examples=600, deadline=None)
@given(stream=_streams(), keep=st.booleans())
def test_lf_fast_path_equals_general_path(stream: tuple[list[bytes], int], keep: bool) -> None:
    chunks, max_event = stream
    fast = SseScanner(keep_usage_chunk=keep, max_event_bytes=max_event)
    ref = SseScanner(keep_usage_chunk=keep, max_event_bytes=max_event)
    for chunk in chunks:
        a, b = _step(fast, chunk, False), _step(ref, chunk, True)
        assert a == b
        assert _state(fast) == _state(ref)
        if a[0] != "ok":
            return  # the relay stops at the first error
    ends = []
    for s in (fast, ref):
        try:
            ends.append(("ok", s.finish()))
        except SseProtocolError as exc:
            ends.append((f"error {exc}", b""))
    assert ends[0] == ends[1]


def test_fast_path_is_taken_for_whole_lf_events() -> None:
    s = SseScanner()
    s.feed(b": open\n\n")  # the BOM check is done
    events = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]\n\n'
    seen: list[bytes] = []
    real = SseScanner._feed_lf

    def spy(self: SseScanner, chunk: bytes) -> bytes:
        seen.append(chunk)
        return real(self, chunk)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(SseScanner, "_feed_lf", spy)
        assert s.feed(events) == events
    assert seen == [events] and s.done and s.output_tokens == 1 and s.finish() == b""


def test_fast_path_error_keeps_events_before_the_bad_one() -> None:
    s = SseScanner()
    s.feed(b"\n")
    good = b'data: {"choices":[{"text":"x"}]}\n\n'
    ref = SseScanner()
    ref.feed(b"\n")
    for scanner, general in ((s, False), (ref, True)):
        assert _step(scanner, good + b"data: nope\n\n", general) == ("error upstream sent an event that is not JSON",
                                                                      good)
    assert _state(s) == _state(ref)
