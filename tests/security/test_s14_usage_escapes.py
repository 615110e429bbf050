"""Session 14, review RV2-1 and RV2-5: ``cached_tokens`` spelt with a JSON escape
(``"cached\\u005ftokens"``, which every parser reads as ``cached_tokens``) or held by a duplicated key
(the parse keeps the last value, some clients the first) no longer reaches a ``drop`` tenant:

* (a) a plain answer whose real usage is escaped and holds a nested literal copy: the cut took the copy,
  the top-level counter went out (gateway/usage_privacy.py, now written again from the parse);
* (b) a stream's comment / ``id:`` / ``event:`` line naming the counter with an escape or another case
  (gateway/sse.py: withheld);
* (c) a stream data event with a duplicated top-level ``usage`` whose first value holds the counter
  (forwarded verbatim before; now written again from its parse); the plain answer's counterpart too.

RV2-5: the ``event``/``id``/``retry`` lines of an event written again are kept. A property test checks
that the plain answer's fast cut and the stream rewrite equal the full rewrite on generated answers
with escapes and duplicated keys, for a client keeping the first value and one keeping the last.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.sse import SseScanner
from gateway.usage_privacy import event_for_drop, may_name_cached, plain_without_cached, without_counter
from tests.support import fake_replicas
from tests.support.fake_replicas import PlainFake, base_app, completion, replicas_of, serving

ESC_USAGE = b'{"prompt_tokens":5,"prompt_tokens_details":{"cached\\u005ftokens":3}}'
#: (a): the real usage escaped, a nested usage copy in vLLM's compact shape before it
SHAPE_A = (b'{"id":"x","choices":[{"index":0,"text":"ok","usage":{"prompt_tokens":5,'
           b'"prompt_tokens_details":{"cached_tokens":3}}}],"usage":' + ESC_USAGE + b"}")
#: (c), plain: a duplicated top-level usage, the first holding the counter, the last not
SHAPE_C = (b'{"id":"x","usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":3}},'
           b'"choices":[{"index":0,"text":"ok"}],"usage":{"prompt_tokens":5}}')


def _first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        out.setdefault(k, v)
    return out


def client_counters(data: bytes) -> list[Any]:
    """The top-level counter as a client keeping the first value and one keeping the last read it."""
    out = []
    for obj in (json.loads(data, object_pairs_hook=_first_wins), json.loads(data)):
        usage = obj.get("usage")
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        out.append(details.get("cached_tokens") if isinstance(details, dict) else None)
    return out


def _plain(data: bytes) -> bytes:
    """What the pipeline does with a plain answer for a drop tenant (gateway/pipeline_answer.py's gate)."""
    obj = orjson.loads(data)
    usage = obj.get("usage")
    if (isinstance(usage, dict) and "prompt_tokens_details" in usage) or may_name_cached(data):  # R14-2: any keys
        return plain_without_cached(data, obj, usage)
    return data


@pytest.mark.parametrize("data", [SHAPE_A, SHAPE_C])
def test_plain_escaped_or_duplicated_counter_does_not_go_out(data: bytes) -> None:
    assert client_counters(data) != [None, None]  # the shape does carry it
    out = _plain(data)
    assert client_counters(out) == [None, None]  # before: (a) [3, 3], (c) [3, None]
    assert orjson.loads(out)["choices"] == without_counter(orjson.loads(data))["choices"]  # R14-2: nested too


def _stream(events: bytes, *, drop: bool = True, split: int | None = None) -> bytes:
    head = b'data: {"choices":[{"index":0,"text":"hi"}]}\n\n'
    whole = head + events + b"data: [DONE]\n\n"
    sc = SseScanner(keep_usage_chunk=True, drop_cached=drop)
    if split is None:
        out = sc.feed(head) + sc.feed(whole[len(head):])
    else:
        out = b"".join(sc.feed(whole[i:i + split]) for i in range(0, len(whole), split))
    out += sc.finish()
    assert out.startswith(head) and out.endswith(b"data: [DONE]\n\n")
    return out[len(head):-len(b"data: [DONE]\n\n")]


LINES_B = [
    b": " + ESC_USAGE,  # a comment with the escaped key
    b"id: " + ESC_USAGE,
    b"event: " + ESC_USAGE,
    b": {\"usage\":{\"prompt_tokens_details\":{\"Cached_Tokens\":3}}}",  # another case
    b"id: {\"\\u0063ached_tokens\":3}",
]


@pytest.mark.parametrize("line", LINES_B)
@pytest.mark.parametrize("split", [None, 1, 7])
def test_stream_non_data_lines_with_an_escape_or_any_case_are_withheld(line: bytes, split: int | None) -> None:
    data = b'data: {"choices":[{"index":0,"text":"a"}]}'
    out = _stream(line + b"\n" + data + b"\n\n", split=split)
    assert out == data + b"\n\n"  # before: the line went out with the event
    assert _stream(line + b"\n\n", split=split) == b""  # a data-less event: nothing
    assert _stream(line + b"\n" + data + b"\n\n", drop=False, split=split) == line + b"\n" + data + b"\n\n"


@pytest.mark.parametrize("split", [None, 1, 7])
def test_stream_duplicated_usage_key_is_written_again_from_its_parse(split: int | None) -> None:
    event = (b'data: {"choices":[],"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":3}},'
             b'"usage":{"prompt_tokens":5}}\n\n')
    out = _stream(event, split=split)
    assert out.startswith(b"data: ") and out.endswith(b"\n\n")
    assert client_counters(out[6:-2]) == [None, None]  # before: forwarded verbatim, [3, None]
    assert json.loads(out[6:-2]) == {"choices": [], "usage": {"prompt_tokens": 5}}
    escaped = b'data: {"choices":[],"usage":' + ESC_USAGE + b',"usage":null}\n\n'
    assert client_counters(_stream(escaped, split=split)[6:-2]) == [None, None]
    assert _stream(event, drop=False, split=split) == event  # pass: as received


@pytest.mark.parametrize("drop", [True, False])
@pytest.mark.parametrize("split", [None, 1, 7])
def test_event_type_and_id_are_kept_when_the_event_is_written_again(drop: bool, split: int | None) -> None:
    usage = b'data: {"choices":[],"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":3}}}'
    out = _stream(b"event: usage\nid: 42\nretry: 900\n" + usage + b"\n\n", drop=drop, split=split)
    assert out.startswith(b"event: usage\nid: 42\nretry: 900\n")  # before: "data: ..." alone (drop)
    assert (b"cached_tokens" in out) is not drop
    # a withheld line (an unknown field: any tenant) keeps the event's type and id too
    chunk = b'data: {"choices":[{"index":0,"text":"a"}]}'
    out = _stream(b"event: delta\nx-extra: 1\nid: 43\n" + chunk + b"\n\n", drop=drop, split=split)
    assert out == b"event: delta\nid: 43\n" + chunk + b"\n\n"  # before: the data line alone
    out = _stream(b"id: 44\nx-extra: 1\n\n", drop=drop, split=split)  # no data: the id still counts
    assert out == b"id: 44\n\n"


# --- the property: fast paths equal the full rewrite, for a client keeping the first or the last value


def _key(name: str, draw: Any) -> bytes:
    """``name`` as a JSON key, some characters written as ``\\uXXXX``."""
    chars = []
    for ch in name:
        chars.append(f"\\u{ord(ch):04x}" if draw(st.integers(0, 7)) == 0 else ch)
    return b'"' + "".join(chars).encode() + b'"'


def _obj(pairs: list[tuple[bytes, bytes]], sep: bytes) -> bytes:
    return b"{" + sep.join(k + b":" + v for k, v in pairs) + b"}"


@st.composite
def raw_answers(draw: Any) -> bytes:
    sep = draw(st.sampled_from([b",", b", "]))
    details = [(_key("cached_tokens", draw), str(draw(st.integers(0, 99))).encode())]
    if draw(st.booleans()):
        details.append((_key("audio_tokens", draw), b"0"))
    if draw(st.integers(0, 3)) == 0:  # a duplicated counter key
        details.append((_key("cached_tokens", draw), str(draw(st.integers(0, 99))).encode()))
    details = draw(st.permutations(details))
    usage = [(_key("prompt_tokens", draw), b"5"), (_key("completion_tokens", draw), b"1")]
    if draw(st.integers(0, 5)):
        usage.append((_key("prompt_tokens_details", draw), _obj(details, b",")))
    usage = list(draw(st.permutations(usage)))
    if draw(st.integers(0, 3)) == 0:  # a duplicated details key, either holding the counter or not
        usage.insert(draw(st.integers(0, len(usage))), (_key("prompt_tokens_details", draw),
                                                        draw(st.sampled_from([b"{}", b'{"cached_tokens":7}']))))
    real = _obj(usage, sep)
    text = draw(st.sampled_from(['"ok"', '"\\u00e9t\\u00e9"', '"\\\\u005f"', '"cached_tokens"']))
    choice = b'{"index":0,"text":' + text.encode()
    if draw(st.booleans()):  # a nested usage copy (vLLM's compact piece), whose counter goes too (R14-2)
        choice += b',"usage":{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":3}}'
    top = [(b'"id"', b'"x"'), (b'"choices"', b"[" + choice + b"}]"), (_key("usage", draw), real)]
    top = list(draw(st.permutations(top)))
    if draw(st.integers(0, 3)) == 0:  # a duplicated top-level usage
        other = draw(st.sampled_from([b"null", b"{}", b'{"prompt_tokens_details":{"cached_tokens":9}}',
                                      b'{"prompt_tokens_details":{"cached\\u005ftokens":9}}']))
        top.insert(draw(st.integers(0, len(top))), (_key("usage", draw), other))
    return _obj(top, sep)


def _both(data: bytes) -> tuple[Any, Any]:
    return json.loads(data, object_pairs_hook=_first_wins), json.loads(data)


@settings(max_examples=800, deadline=None)
@given(raw_answers())
def test_fast_paths_equal_the_full_rewrite_with_escapes_and_duplicated_keys(data: bytes) -> None:
    obj = orjson.loads(data)
    usage = obj["usage"]
    full = orjson.dumps(without_counter(obj))  # the full rewrite: no duplicates, no counter at any depth (R14-2)
    out = _plain(data)
    assert client_counters(out) == [None, None]
    ev = event_for_drop(data, obj, usage)
    sent = data if ev is None else ev[len(b"data: "):-2]
    assert client_counters(sent) == [None, None]
    if not may_name_cached(data):
        # bytes that cannot name the counter go out as the replica sent them (S15-1), both paths; a replica's
        # duplicated keys naming no counter (e.g. a first ``"usage":null``) are its own ambiguity, not a leak
        assert out is data and sent is data
        return
    assert _both(out) == _both(full)  # first-wins and last-wins clients read what the full rewrite says
    if out is data:
        assert _both(data)[0] == _both(data)[1]  # forwarded as received only when both clients agree
    assert _both(sent) == _both(full)


# --- end to end: a replica sending these shapes, a drop tenant (the default)


Fake = PlainFake
n_replicas = fake_replicas.n_replicas  # fixture: the stack's simulated cluster is not used (one replica)


def _app(fake: Fake) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        shape = SHAPE_A if "shape-a" in body["prompt"] else SHAPE_C
        if not body.get("stream"):
            return web.Response(body=shape, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"text":"ok"}]}\n\n')
        await resp.write(b": " + ESC_USAGE + b"\nevent: usage\nid: 7\ndata: " + shape + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp
    return base_app(fake, completions)



@pytest.fixture
async def fakes() -> AsyncIterator[list[Fake]]:
    async with serving([Fake()], _app) as out:
        yield out


@pytest.fixture
def config_overrides(fakes: list[Fake]) -> dict[str, Any]:
    return replicas_of(fakes)


@pytest.mark.parametrize("prompt", ["shape-a", "shape-c"])
async def test_a_drop_tenant_reads_no_counter_end_to_end(stack: Any, fakes: list[Fake], prompt: str) -> None:
    r = await stack.client.post("/v1/completions", json=completion(prompt), headers=stack.auth("tenant-a/app"))
    assert r.status_code == 200, r.text
    assert client_counters(r.content) == [None, None]
    assert r.headers["content-length"] == str(len(r.content))
    async with stack.client.stream("POST", "/v1/completions", json=completion(prompt, stream=True,
                                                                  stream_options={"include_usage": True}),
                                   headers=stack.auth("tenant-a/app")) as s:
        assert s.status_code == 200
        got = b"".join([part async for part in s.aiter_bytes()])
    assert b"\\u005f" not in got  # the comment is withheld, the event written again from its parse
    assert b"event: usage\nid: 7\ndata: " in got  # RV2-5: the rewritten event keeps its type and id
    usage_event = got.split(b"event: usage\nid: 7\ndata: ")[1].split(b"\n\n")[0]
    assert client_counters(usage_event) == [None, None]
