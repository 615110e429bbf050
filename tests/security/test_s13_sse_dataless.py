"""Review R12b-7 (session 13), first corner: the SSE scanner forwarded an event without ``data`` lines
as received, so a replica could relay ``cached_tokens`` to a ``drop`` tenant in an unknown field line
(SSE clients ignore it, raw readers do not) or a comment. Now such lines are not forwarded
(gateway/sse.py): an event goes out as its data lines alone, a data-less one not at all; comments
and ``event``/``id``/``retry`` lines still pass (keep-alives)."""

from __future__ import annotations

import pytest

from gateway.sse import SseScanner

USAGE = b'{"usage":{"prompt_tokens":5,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":3}}}'
CHUNK = b'data: {"choices":[{"index":0,"text":"hi"}]}'
HEAD = CHUNK + b"\n\n"  # the stream has started (the LF-only fast path runs after it)


def _run(stream: bytes, *, drop: bool = True, split: int | None = None) -> bytes:
    sc = SseScanner(keep_usage_chunk=True, drop_cached=drop)
    if split is None:
        out = sc.feed(HEAD) + sc.feed(stream)
    else:
        whole = HEAD + stream
        out = b"".join(sc.feed(whole[i:i + split]) for i in range(0, len(whole), split))
    return out + sc.finish()


CASES = [
    # (stream after HEAD, what goes out after HEAD for a drop tenant)
    (USAGE + b"\n\n" + b"data: [DONE]\n\n", b"data: [DONE]\n\n"),  # a bare JSON line: a field named '{"usage"'
    (b": " + USAGE + b"\n\ndata: [DONE]\n\n", b"data: [DONE]\n\n"),  # a comment naming the counter
    (b"id: " + USAGE + b"\n\ndata: [DONE]\n\n", b"data: [DONE]\n\n"),  # a known field naming it
    (b"x-usage: " + USAGE + b"\n" + CHUNK + b"\n\ndata: [DONE]\n\n", CHUNK + b"\n\ndata: [DONE]\n\n"),
    (b": ping\n\nevent: x\nid: 7\nretry: 10\n\ndata: [DONE]\n\n", b": ping\n\nevent: x\nid: 7\nretry: 10\n\ndata: [DONE]\n\n"),
]


@pytest.mark.parametrize("stream, expect", CASES)
@pytest.mark.parametrize("split", [None, 1, 7])
def test_dataless_and_unknown_lines_do_not_carry_the_counter(stream: bytes, expect: bytes, split: int | None) -> None:
    for eol in (b"\n", b"\r\n"):
        s, e = stream.replace(b"\n", eol), expect
        if eol == b"\r\n":  # an event forwarded as received keeps its line ends; a rewritten one is LF
            e = expect.replace(b"\n", eol) if b"x-usage" not in stream else CHUNK + b"\n\n" + b"data: [DONE]\r\n\r\n"
        out = _run(s, split=split)
        assert out == HEAD + e, (eol, split)
        assert b"cached_tokens" not in out


def test_a_pass_tenant_still_gets_comments_and_known_fields_as_sent() -> None:
    stream = b": " + USAGE + b"\n\nid: 1\n\ndata: [DONE]\n\n"
    assert _run(stream, drop=False) == HEAD + stream
    assert _run(USAGE + b"\n\ndata: [DONE]\n\n", drop=False) == HEAD + b"data: [DONE]\n\n"  # unknown field: never
