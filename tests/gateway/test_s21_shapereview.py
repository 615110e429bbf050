"""Session 21, review of the SSE delta-shape read (gateway/sse_shape.py; S21-shapereview-*): a second,
adversarial differential against ``SseScanner(shapes=False)`` with its own generators (a replica's
deltas with arbitrary bytes as text, ``data:`` without the space, several data lines, BOM, CR, comments,
``event``/``id`` lines, usage, n>1, tool_calls, reasoning_content, keys repeated in the tail, whitespace
variants, events after ``[DONE]``, an oversize event), reads split at every byte boundary; and the
scanner's errors for events a ``drop`` tenant's rewrite cannot write (S21-stream-1)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sse import SseProtocolError, SseScanner

_ENVELOPES = [  # (head, tail) around the varying text token: vLLM/SGLang shapes and hostile ones
    (b'{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":',
     b',"logprobs":null,"finish_reason":null}],"usage":null}'),
    (b'{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":',
     b'},"logprobs":null,"finish_reason":null}]}'),
    (b'{"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ', b'}}], "usage": null}'),
    (b'{"choices":[{"delta":{"content":', b',"reasoning_content":null}}]}'),
    (b'{"choices":[{"delta":{"content":', b',"reasoning_content":" r"}}]}'),
    (b'{"choices":[{"delta":{"content":', b',"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}'),
    (b'{"choices":[{"delta":{"content":', b',"content":"x"}}]}'),  # a key repeated in the tail: it wins
    (b'{"choices":[{"text":', b',"text":""}]}'),
    (b'{"choices":[{"text":', b'}],"choices":[{"text":"z"}]}'),
    (b'{"choices":[{"text":', b'}],"usage":{"prompt_tokens":1}}'),
    (b'{"choices":[{"text":', b'}],"usage":null,"usage":{"prompt_tokens":1,"prompt_tokens_details":{"cached_tokens":1}}}'),
    (b'{"choices":[{"text":', b'}],"error":null}'),
    (b'{"choices":[{"text":', b'},{"text":"b"}]}'),
    (b'{"choices":[{"text":', b'}], "x": {"cached_tokens": 2}}'),
    (b'{"choices":[{"text":', b'}]}'),
    (b'\t{ "choices" :\n[ { "text"\t:  ', b' } ] }  '),
    (b'{"choices":[{"text":', b'}],"n":1e400}'),
    (b'{"choices":[{"text":', b'}],"n":12345678901234567890123}'),
    (b'{"choices":[{"text":"a","text":', b'}]}'),
    (b'{"choices":[{"text":', b'}]'),  # not JSON
    (b'{"choices":{"text":', b'}}'),
]
_TEXTS = st.one_of(
    st.sampled_from([b"", b" a", b" tok", b" \xc3\xa9", b"\xf0\x9f\x98\x80", b"\xff", b"\xc3", b"\xed\xa0\x80",
                     b"\\u0041", b"\\ud800", b'a"b', b"\\n", b"\x7f", b"\x00", b"\t", b"cached_tokens",
                     b"\xe2\x80\xa8", b"[DONE]", b'","text":"q']),
    st.binary(max_size=6),
    st.text(alphabet=" ab\u00e9\U0001F600\"\\", max_size=5).map(str.encode),
)
_PREFIXES = [b"data: "] * 12 + [b"data:", b"data:  ", b": c\ndata: ", b"event: m\ndata: ", b"id: 3\ndata: ",
                                 b": cached\ndata: ", b"x-u: 1\ndata: ", b"data: \ndata: "]


@st.composite
def _event(draw: Any, envelopes: list[int]) -> bytes:
    kind = draw(st.integers(0, 19))
    if kind == 0:
        return draw(st.sampled_from([b"data: [DONE]\n\n", b": keep-alive\n\n", b"retry: 5\n\n", b"\n",
                                     b"data:[DONE]\n\n", b"data: \n\n", b"event: x\n\n"]))
    head, tail = _ENVELOPES[draw(st.sampled_from(envelopes))]
    text = draw(_TEXTS)
    data = head + b'"' + text + b'"' + tail
    prefix = draw(st.sampled_from(_PREFIXES)) if draw(st.integers(0, 3)) == 0 else b"data: "
    if draw(st.integers(0, 15)) == 0:  # data over two lines
        cut = draw(st.integers(0, len(data)))
        data = data[:cut] + draw(st.sampled_from([b"\ndata: ", b"\ndata:", b"\n"])) + data[cut:]
    end = draw(st.sampled_from([b"\n\n"] * 10 + [b"\n\n\n", b"\n\n:c\n\n"]))
    return prefix + data + end


@st.composite
def _stream(draw: Any) -> tuple[list[bytes], bool, bool, int]:
    envelopes = draw(st.lists(st.integers(0, len(_ENVELOPES) - 1), min_size=1, max_size=3))
    events = draw(st.lists(_event(envelopes), min_size=1, max_size=14))
    raw_events = [*events, b"data: [DONE]\n\n", *draw(st.lists(_event(envelopes), max_size=3))]
    if draw(st.integers(0, 7)) == 0:
        raw_events[0] = b"\xef\xbb\xbf" + raw_events[0]
    if draw(st.integers(0, 7)) == 0:
        i = draw(st.integers(0, len(raw_events) - 1))
        raw_events[i] = raw_events[i].replace(b"\n", draw(st.sampled_from([b"\r\n", b"\r"])))
    limit = draw(st.sampled_from([1 << 20, 1 << 20, 60, 120, 200]))
    if draw(st.booleans()):
        chunks = raw_events
    else:
        raw = b"".join(raw_events)
        cuts = sorted(set(draw(st.lists(st.integers(0, len(raw)), max_size=12))))
        chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
    return chunks, draw(st.booleans()), draw(st.booleans()), limit


_STATE = ("usage", "done", "events", "output_tokens", "_buf", "_pos", "_data", "_cr_end", "_cr_dispatched",
          "_started", "_special", "_withhold", "_fields")


def _state(scanner: SseScanner) -> tuple[Any, ...]:
    return tuple(bytes(v) if isinstance(v, bytearray) else tuple(v) if isinstance(v, list) else dict(v)
                 if isinstance(v, dict) else v for v in (getattr(scanner, n) for n in _STATE))


def _run(chunks: list[bytes], keep: bool, drop: bool, limit: int, shapes: bool) -> list[Any]:
    scanner = SseScanner(keep_usage_chunk=keep, drop_cached=drop, max_event_bytes=limit, shapes=shapes)
    seen: list[Any] = []
    for chunk in chunks:
        try:
            seen.append(("ok", scanner.feed(chunk), _state(scanner)))
        except SseProtocolError as exc:
            seen.append(("error", str(exc), exc.forward, _state(scanner)))
            break
        except Exception as exc:  # anything else escaping feed is compared too (and is a finding)
            seen.append(("raised", type(exc).__name__, str(exc)))
            break
    else:
        try:
            seen.append(("end", scanner.finish()))
        except SseProtocolError as exc:
            seen.append(("end error", str(exc)))
    seen.append((scanner.usage, scanner.done, scanner.events, scanner.output_tokens))
    return seen


@settings(max_examples=1500, deadline=None)
@given(_stream())
def test_shape_path_is_the_parsed_path_on_hostile_streams(case: tuple[list[bytes], bool, bool, int]) -> None:
    chunks, keep, drop, limit = case
    assert _run(chunks, keep, drop, limit, True) == _run(chunks, keep, drop, limit, False)


def _delta(text: bytes, envelope: int = 0) -> bytes:
    head, tail = _ENVELOPES[envelope]
    return b"data: " + head + b'"' + text + b'"' + tail + b"\n\n"


@settings(max_examples=400, deadline=None)
@given(st.integers(0, len(_ENVELOPES) - 1), st.lists(_TEXTS, min_size=3, max_size=8), st.lists(st.integers(0, 10 ** 6),
       min_size=1, max_size=3), st.booleans(), st.booleans(), st.sampled_from([1 << 20, 90, 150]))
def test_a_run_of_one_shape_split_anywhere(envelope: int, texts: list[bytes], cuts: list[int], keep: bool,
                                           drop: bool, limit: int) -> None:
    raw = b"".join(_delta(t, envelope) for t in texts) + b"data: [DONE]\n\n"
    points = sorted({c % (len(raw) + 1) for c in cuts})
    first = _delta(b" a", envelope) + _delta(b" b", envelope)  # learnt from the second event
    chunks = [first, *(raw[a:b] for a, b in zip([0, *points], [*points, len(raw)]))]
    assert _run(chunks, keep, drop, limit, True) == _run(chunks, keep, drop, limit, False)


def test_every_two_and_three_read_split_of_a_mixed_stream() -> None:
    learn = _delta(b" a") + _delta(b" b")  # the shape is learnt from the second event: a read of its own
    raw = (_delta(b" c") + b": ka\n\n" + _delta(b"") + _delta(b"\xff")
           + b"id: 4\n" + _delta(b" d") + _delta(b" e") + b"data: " + b"x" * 150 + b"\n\n" + _delta(b" f")
           + b"data: [DONE]\n\n" + _delta(b" g"))
    for limit in (1 << 20, 120):
        splits = [(i, i) for i in range(len(raw) + 1)]  # two reads: every byte boundary
        splits += [(i, j) for i in range(0, len(raw) + 1, 13) for j in range(i + 1, len(raw) + 1, 29)]  # three
        for i, j in splits:
            chunks = [learn, raw[:i], raw[i:j], raw[j:]]
            for keep, drop in ((True, False), (False, True)):
                assert _run(chunks, keep, drop, limit, True) == _run(chunks, keep, drop, limit, False), (i, j)


def test_an_event_a_drop_tenants_rewrite_cannot_write_is_a_protocol_error() -> None:
    """S21-stream-1: a lone surrogate (raw UTF-8-encoded surrogate bytes, which the parse reads with
    ``surrogatepass``, or a ``\\ud800`` escape) in an event that a ``drop`` tenant gets written again (a
    ``\\u`` escape or the counter's name) cannot be encoded: an SseProtocolError whose ``forward`` holds the
    valid events of the read before it, as for any other malformed event (was: UnicodeEncodeError, and
    those events lost)."""
    for bad in (b'data: {"choices":[{"text":"\xed\xa0\x80\\u0041"}]}\n\n', b'data: {"choices":[{"text":"\\ud800"}]}\n\n',
                b'data: {"choices":[{"text":"\xed\xa0\x80"}],"x":{"cached_tokens":1}}\n\n'):
        for shapes in (True, False):
            for general in (False, True):  # the LF-only path and the general one (a CR in the read)
                scanner = SseScanner(drop_cached=True, shapes=shapes)
                valid = _delta(b" a") + _delta(b" b")
                assert scanner.feed(valid) == valid
                good = _delta(b" c").replace(b"\n\n", b"\r\n\r\n") if general else _delta(b" c")
                try:
                    scanner.feed(good + bad)
                except SseProtocolError as exc:
                    assert exc.forward == good
                else:
                    raise AssertionError("no error")


def test_an_oversize_event_forwards_the_valid_events_of_its_read_before_it() -> None:
    """S21-shapereview-2: an event growing past ``max_event_bytes`` is a protocol error whose ``forward``
    holds the whole events of the same read before it (they were checked and dispatched; was: b"", the
    client never got them), in the LF-only path, the general one and the shape path alike."""
    for shapes in (True, False):
        for general in (False, True):
            scanner = SseScanner(max_event_bytes=120, shapes=shapes)
            valid = _delta(b" a") + _delta(b" b")
            assert scanner.feed(valid) == valid
            good = _delta(b" c").replace(b"\n\n", b"\r\n\r\n") if general else _delta(b" c")
            try:
                scanner.feed(good + b"data: " + b"x" * 200)
            except SseProtocolError as exc:
                assert exc.forward == good
            else:
                raise AssertionError("no error")
