"""Issue 14, session 21: the SSE scanner reads delta events of a learnt shape without a JSON parse
(gateway/sse_shape.py). Differential (hypothesis) against the scanner with ``shapes=False`` (every event
parsed, the behaviour before): same bytes forwarded per read, same errors (and their ``forward``), same
usage, ``done``, event and output-token counts, same end; and the shape's own claim checked on arbitrary
bytes: whatever it reads without a parse parses to the learnt object with only the text changed."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway.sse import SseScanner
from gateway.sse_events import has_output as _has_output
from gateway.sse_shape import learn_shape
from tests.gateway.test_s21_shapereview import _run as _run_bounded

#: generated text: plain words, escapes JSON needs (quote, backslash, controls), non-ASCII, the counter's name
_TEXT = st.one_of(
    st.text(alphabet=" abé😀", max_size=8),
    st.text(alphabet=" abé😀", max_size=8),
    st.sampled_from(["", " a", " tok tok", " é ü", " 😀", "cached_tokens", ' q"r', " x\ny", "\\", "\x00", "\x7f",
                     " prompt_tokens_details", "\u2028"]),
    st.text(max_size=12),
)


def _choice(chat: bool, text: str, finish: str | None, extra: bool) -> dict[str, Any]:
    if chat:
        delta: dict[str, Any] = {"content": text}
        if extra:
            delta["reasoning_content"] = None
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}


@st.composite
def _event(draw: Any, chat: bool, ids: tuple[str, int], style: tuple[tuple[str, str], bool]) -> str:
    kind = draw(st.sampled_from(["delta"] * 16 + ["finish", "usage", "two", "error", "bad", "empty", "cached"]))
    obj: dict[str, Any] = {"id": ids[0], "object": "chat.completion.chunk" if chat else "text_completion",
                           "created": ids[1], "model": "m"}
    text = draw(_TEXT)
    if kind == "usage":
        obj["choices"] = []
        obj["usage"] = {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14,
                        **({"prompt_tokens_details": {"cached_tokens": 4}} if draw(st.booleans()) else {})}
    elif kind == "two":
        obj["choices"] = [_choice(chat, text, None, False), _choice(chat, draw(_TEXT), None, False)]
    elif kind == "error":
        obj["error"] = {"message": "x"}
    elif kind == "cached":
        obj["choices"] = [_choice(chat, text, None, False)]
        obj["usage"] = None
        obj["x"] = {"cached_tokens": 1}
    else:
        obj["choices"] = [_choice(chat, text, "length" if kind == "finish" else None, draw(st.booleans()))]
        obj["usage"] = None
    sep, ascii_only = style if draw(st.integers(0, 9)) else (draw(st.sampled_from([(",", ":"), (", ", ": ")])), False)
    data = json.dumps(obj, separators=sep, ensure_ascii=ascii_only)
    if kind == "bad":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif kind == "empty":
        data = "[1]"
    if draw(st.integers(0, 9)) == 0:  # data of two lines (joined with LF: valid JSON when cut between tokens)
        cut = draw(st.sampled_from([i + 1 for i, c in enumerate(data) if c == ","] or [0]))
        data = data[:cut] + draw(st.sampled_from(["\ndata: ", "\n"])) + data[cut:]
    prefix = draw(st.sampled_from(["data: "] * 16 + ["data:", ": c\ndata: ", "event: m\ndata: ", "id: 3\ndata: "]))
    return prefix + data + "\n\n"


@st.composite
def _stream(draw: Any) -> tuple[list[bytes], bool, bool]:
    chat = draw(st.booleans())
    ids = (draw(st.sampled_from(["cmpl-1", "chatcmpl-x", "é"])), draw(st.integers(0, 2**40)))
    style = (draw(st.sampled_from([(",", ":"), (", ", ": ")])), draw(st.booleans()))  # the replica's JSON writer
    events = draw(st.lists(_event(chat, ids, style), min_size=1, max_size=16))
    if draw(st.booleans()):  # a stream of one repeated delta shape: the fast path's case
        events = [events[0]] * draw(st.integers(2, 6)) + events
    raw_events = [e.encode() for e in events] + [b"data: [DONE]\n\n"]
    if draw(st.booleans()):  # raw bytes of invalid UTF-8 inside a text: json refuses them
        i = draw(st.integers(0, len(raw_events) - 1))
        j = raw_events[i].find(b'"text":"') if not chat else raw_events[i].find(b'"content":"')
        if j >= 0:
            k = j + (8 if not chat else 11)
            raw_events[i] = raw_events[i][:k] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) \
                + raw_events[i][k:]
    if draw(st.booleans()):  # CRLF somewhere
        i = draw(st.integers(0, len(raw_events) - 1))
        raw_events[i] = raw_events[i].replace(b"\n", b"\r\n")
    if draw(st.booleans()):  # one read per event (as on a live stream), else cut anywhere, several per read
        chunks = raw_events
    else:
        raw = b"".join(raw_events)
        cuts = sorted(set(draw(st.lists(st.integers(0, len(raw)), max_size=10))))
        chunks = [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]
    return chunks, draw(st.booleans()), draw(st.booleans())


#: the scanner's state after each read (all of it but the learnt shape)
def _run(chunks: list[bytes], keep: bool, drop: bool, shapes: bool) -> list[Any]:
    """Everything a client and the accounting see of ``chunks`` through one scanner (the shapereview's
    differential run, at the default event bound)."""
    return _run_bounded(chunks, keep, drop, 1 << 20, shapes)  # SseScanner's default max_event_bytes


@settings(max_examples=600, deadline=None)
@given(_stream())
def test_scanner_with_shapes_is_the_scanner_without(case: tuple[list[bytes], bool, bool]) -> None:
    chunks, keep, drop = case
    assert _run(chunks, keep, drop, True) == _run(chunks, keep, drop, False)


def _delta(text: str, chat: bool = False, **kw: Any) -> bytes:
    obj = {"id": "cmpl-7", "object": "text_completion", "created": 5, "model": "m",
           "choices": [_choice(chat, text, None, False)], "usage": None, **kw}
    return b"data: " + json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


def test_a_stream_of_deltas_is_read_without_a_parse_after_its_second_event(monkeypatch: Any) -> None:
    scanner = SseScanner(keep_usage_chunk=False, drop_cached=True)
    for text in (" a", " b"):
        assert scanner.feed(_delta(text)) == _delta(text)
    assert scanner._shape is not None
    import gateway.sse as sse

    def no_parse(*_: Any) -> Any:
        raise AssertionError("parsed")

    monkeypatch.setattr(sse.json_fast, "loads", no_parse)
    for text in (" c d", "", " é"):
        assert scanner.feed(_delta(text)) == _delta(text)
    assert (scanner.events, scanner.output_tokens) == (5, 4)  # the empty text carries no output


def test_a_text_equal_to_another_field_is_found_at_its_own_place() -> None:
    payload = _delta("m")[6:-2]  # the model is "m" too: the text's token is the later one
    shape = learn_shape(payload, json.loads(payload), _has_output)
    assert shape is not None and shape.head.endswith(b'"text":')
    payload = b'{"model":"m","choices":[{"text":"m","index":0}],"id":"m"}'  # the last "m" is the id's
    shape = learn_shape(payload, json.loads(payload), _has_output)
    assert shape is not None and shape.head.endswith(b'"text":')


def test_no_shape_for_escapes_usage_objects_errors_or_several_choices() -> None:
    for payload in (b'{"choices":[{"text":"a\\nb"}]}', b'{"choices":[{"text":"a"}],"usage":{"prompt_tokens":1}}',
                    b'{"choices":[{"text":"a"}],"error":1}', b'{"choices":[{"text":"a"},{"text":"a"}]}',
                    b'{"choices":[{"text":1}]}', b'{"choices":[{"delta":{"role":"assistant"}}]}',
                    b'{"choices":[{"text":"a"}],\n"x":1}'):  # two data lines: the second a field line on the wire
        assert learn_shape(payload, json.loads(payload), _has_output) is None


@settings(max_examples=800, deadline=None)
@given(st.binary(max_size=24), st.booleans(), st.sampled_from([(",", ":"), (", ", ": ")]))
@example(b"\xff", False, (",", ":"))
@example(b"a\\u0041", True, (",", ":"))
@example(b'a","text":"b', False, (",", ":"))
def test_what_a_shape_reads_parses_to_the_learnt_object_with_that_text(middle: bytes, chat: bool,
                                                                       sep: tuple[str, str]) -> None:
    obj = {"id": "c", "model": "m", "choices": [_choice(chat, " t", None, True)], "usage": None}
    payload = json.dumps(obj, separators=sep).encode()
    shape = learn_shape(payload, json.loads(payload), _has_output)
    assert shape is not None
    chunk = shape.head + b'"' + middle + b'"' + shape.tail
    events, n, read = shape.read(chunk)
    if not read:
        return
    assert (events, read) == (1, len(chunk))
    got = json.loads(chunk[6:-2])
    text = middle.decode()
    if chat:
        obj["choices"][0]["delta"]["content"] = text  # type: ignore[index]
    else:
        obj["choices"][0]["text"] = text  # type: ignore[index]
    assert got == obj
    assert n == sum(1 for c in got["choices"] if _has_output(c))


@settings(max_examples=300, deadline=None)
@given(st.booleans(), st.lists(st.text(alphabet=' ab"\\\né😀', max_size=6), min_size=2, max_size=20),
       st.booleans(), st.booleans(), st.lists(st.integers(0, 4000), max_size=8), st.booleans())
def test_runs_of_deltas_read_by_shape_are_the_parsed_ones(chat: bool, texts: list[str], ascii_only: bool,
                                                          per_event: bool, cuts: list[int], drop: bool) -> None:
    events = [b"data: " + json.dumps({"id": "x", "model": "m", "choices": [_choice(chat, t, None, False)],
                                      "usage": None}, separators=(",", ":"), ensure_ascii=ascii_only).encode() + b"\n\n"
              for t in texts] + [b"data: [DONE]\n\n"]
    if per_event:
        chunks = events
    else:
        raw = b"".join(events)
        points = sorted({c % (len(raw) + 1) for c in cuts})
        chunks = [raw[a:b] for a, b in zip([0, *points], [*points, len(raw)])]
    assert _run(chunks, False, drop, True) == _run(chunks, False, drop, False)
