"""Session 28 (final28, attack on stream28's ``_feed_split`` and cut28's one-line usage cut): a ``drop`` tenant's
stream (learnt delta shapes spaced or compact, a usage event in one of 14 shapes: spaced, compact, escaped key,
duplicated ``usage`` / ``prompt_tokens_details`` / counter, a nested or top-level ``prompt_tokens_details``, data on
several lines; comments naming the counter; LF, CRLF or CR line ends), cut into reads at any points. Property:
(a) no key a client reads as ``cached_tokens`` (WHATWG SSE reader, every pair of a duplicated key checked) and no
comment or field line naming it; (b) the split feed, with learnt shapes on or off, gives the output-token count,
event count, usage and ``[DONE]`` of one whole read, and its bytes unless it fails as that read fails; (c) without
``include_usage`` no usage-only chunk goes out."""
from __future__ import annotations
import json
from typing import Any
from hypothesis import given, settings, strategies as st, HealthCheck
from gateway.sse import SseScanner, SseProtocolError

def chat(text, spaced):
    o = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return json.dumps(o, separators=(", ", ": ") if spaced else (",", ":"))

USAGES = [
    '{"id": "c1", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7, "prompt_tokens_details": {"cached_tokens": 4}}}',
    '{"id":"c1","choices":[],"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":4}}}',
    '{"id":"c1","choices":[],"usage":{"prompt_tokens_details":{"cached_tokens":4},"prompt_tokens":5}}',
    '{"id":"c1","choices":[],"usage":{"prompt_tokens":5,"prompt_tokens_details":{"\\u0063ached_tokens":4}}}',
    '{"id":"c1","choices":[],"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":4}},"usage":{"prompt_tokens":5}}',
    '{"id":"c1","choices":[],"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":4},"prompt_tokens_details":{"cached_tokens":4}}}',
    '{"id":"c1","choices":[{"index":0,"delta":{"content":"x"},"usage":{"prompt_tokens_details":{"cached_tokens":4}}}]}',
    '{"id":"c1","choices":[{"index":0,"delta":{"content":"x"}}],"prompt_tokens_details":{"cached_tokens":4}}',
    '{"id": "c1", "choices": [], "usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}, "prompt_tokens_details": {"cached_tokens": 4}}}',
    '{"id": "c1", "choices": [], "usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}}, "x": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}}}',
    '{"id": "c1", "choices": [], "usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}}, "usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}}}',
    '{"id": "c1", "choices": [], "usage": {"prompt_tokens": 5,\t"prompt_tokens_details" :{ "cached_tokens" : 4 } }}',
    '{"id": "c1", "choices": [], "usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4, "cached_tokens": 4}}}',
    '{"id": "c1", "choices": [], "usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}}, "usage": {"prompt_tokens": 5}}',
]

@st.composite
def streams(draw):
    spaced = draw(st.booleans())
    n = draw(st.integers(1, 6))
    evs = []
    for i in range(n):
        evs.append(("data", chat(draw(st.sampled_from(["a", " b", "", "é", "x y"])), spaced)))
    k = draw(st.integers(0, len(evs)))
    u = draw(st.sampled_from(USAGES))
    evs.insert(k, ("data", u))
    if draw(st.booleans()):
        evs.insert(draw(st.integers(0, len(evs))), ("comment", draw(st.sampled_from([": keep", ": cached_tokens 4", ": \\u0063"]))))
    for i in range(2):
        evs.append(("data", chat("z", spaced)))
    evs.append(("data", "[DONE]"))
    eol = draw(st.sampled_from(["\n", "\n", "\r\n", "\r"]))
    out = []
    for kind, d in evs:
        if kind == "comment":
            out.append(d + eol + eol)
        elif draw(st.integers(0, 5)) == 0 and d != "[DONE]":  # data on several lines
            parts = d.split(", ") if ", " in d else d.split(",")
            sep = ", " if ", " in d else ","
            lines = [p + (sep if j < len(parts) - 1 else "") for j, p in enumerate(parts)]
            out.append("".join("data: " + l.rstrip() + eol for l in lines) + eol)
        else:
            out.append("data: " + d + eol + eol)
    raw = "".join(out).encode()
    cuts = sorted(set(draw(st.lists(st.integers(1, max(1, len(raw) - 1)), max_size=8))))
    return raw, cuts, draw(st.booleans())

def pieces(raw, cuts):
    prev = 0
    for c in cuts + [len(raw)]:
        if c > prev:
            yield raw[prev:c]
            prev = c

def run(raw, cuts, shapes, keep=True):
    s = SseScanner(keep_usage_chunk=keep, drop_cached=True, shapes=shapes)
    out = []
    try:
        for p in pieces(raw, cuts):
            out.append(s.feed(p))
        out.append(s.finish())
        err = None
    except SseProtocolError as e:
        out.append(e.forward)
        err = str(e)
    return b"".join(out), s.output_tokens, s.events, s.usage, s.done, err

def client_events(data: bytes):
    """WHATWG-ish SSE reader: data payloads."""
    text = data.decode()
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    buf = []
    evs = []
    for line in lines:
        if line == "":
            if buf:
                evs.append("\n".join(buf)); buf = []
            continue
        if line.startswith(":"):
            assert "cached" not in line.lower() and "\\u" not in line, line
            continue
        name, _, val = line.partition(":")
        if val.startswith(" "): val = val[1:]
        if name == "data": buf.append(val)
        else:
            assert "cached" not in line.lower(), line
    return evs

def no_counter_pairs(pairs):
    for k, v in pairs:
        assert k != "cached_tokens", pairs
    return dict(pairs)

@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(streams())
def test_no_counter_and_same_counts(case):
    raw, cuts, keep = case
    whole = run(raw, [], False, keep)
    for shapes in (False, True):
        got = run(raw, cuts, shapes, keep)
        assert got[1:] == whole[1:], (got[1:], whole[1:])
        assert got[0] == whole[0] or got[5] is not None
        for ev in client_events(got[0]):
            if ev == "[DONE]": continue
            obj = json.loads(ev, object_pairs_hook=no_counter_pairs)
            if not keep and isinstance(obj.get("usage"), dict):
                assert obj.get("choices"), ev  # a usage-only chunk the client did not ask for
