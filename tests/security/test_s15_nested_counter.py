"""Session 15, review R14-2: with ``usage_cached_tokens: drop`` a ``cached_tokens`` below something other
than the top-level ``usage`` (``choices[0].usage.prompt_tokens_details.cached_tokens``, any nesting) reached
the tenant byte for byte, in a plain answer and in a stream data event: the RV2-1 guards ran only when the
object had a top-level ``usage`` key, and the rewrite kept a nested copy.

Now (gateway/usage_privacy.py ``event_for_drop``, ``plain_without_cached``, ``without_counter``; the gates
in gateway/pipeline_answer.py and gateway/sse.py no longer ask for a top-level ``usage``) an answer or event
whose bytes may name the counter is written again from its parse without any ``cached_tokens`` key.

The property: on generated JSON objects (any nesting of objects and lists, keys spelt with ``\\uXXXX``
escapes, duplicated keys, whitespace and line breaks, strings that hold the name), for a ``drop`` tenant,
plain and stream (data split over lines, the stream cut in random pieces): no key the client's parser reads
(every pair, duplicates included, escapes decoded) is ``cached_tokens``; the result means the input less the
counter (the last-value parse equals an independent recursive removal of the input's); and an input whose
bytes name no ``"cached_tokens"`` and hold no ``\\u`` goes out as received.
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
from tests.support import audit_log as audit_fixtures
from tests.support.audit_log import ListLog
from tests.support import fake_replicas
from tests.support.fake_replicas import PlainFake, base_app, completion, replicas_of, serving
from tests.support.waiting import wait_for

#: the review's shapes: a per-choice usage holding the counter, with and without a top-level usage
NESTED = (b'{"id":"x","choices":[{"index":0,"text":"ok","usage":{"prompt_tokens_details":{"cached_tokens":7}}}],'
          b'"usage":{"prompt_tokens":5,"completion_tokens":1}}')
NESTED_ONLY = b'{"id":"x","choices":[{"index":0,"text":"ok","usage":{"prompt_tokens_details":{"cached_tokens":7}}}]}'
NESTED_ESCAPED = (b'{"id":"x","choices":[{"index":0,"text":"ok","x":[{"d":{"cached\\u005ftokens":7,"audio_tokens":1}}]'
                  b'}]}')


def _pairs_keys(data: bytes) -> list[str]:
    """Every key of every object in ``data`` as a parser reads it (escapes decoded), duplicates included."""
    keys: list[str] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys.extend(k for k, _ in pairs)
        return dict(pairs)

    json.loads(data, object_pairs_hook=hook)
    return keys


def _reference(value: Any) -> Any:
    """The input's meaning less the counter: every ``cached_tokens`` key removed, recursively, and a
    ``prompt_tokens_details`` that held nothing else with it (the top-level rule since session 12)."""
    if isinstance(value, dict):
        return {k: _reference(v) for k, v in value.items()
                if k != "cached_tokens" and not (k == "prompt_tokens_details" and isinstance(v, dict)
                                                 and list(v) == ["cached_tokens"])}
    if isinstance(value, list):
        return [_reference(v) for v in value]
    return value


def plain_for_drop(data: bytes) -> bytes:
    """What gateway/pipeline_answer.py does with a plain answer for a ``drop`` tenant (its gate, R14-2)."""
    obj = orjson.loads(data)
    usage = obj.get("usage")
    if (isinstance(usage, dict) and "prompt_tokens_details" in usage) or may_name_cached(data):
        return plain_without_cached(data, obj, usage)
    return data


HEAD = b'data: {"choices":[{"index":0,"text":"hi"}]}\n\n'
DONE = b"data: [DONE]\n\n"


def stream_for(events: bytes, *, drop: bool = True, split: int | None = None) -> bytes:
    """``events`` between a first chunk and ``[DONE]`` through the scanner (cut in ``split``-byte pieces);
    what goes out between the two."""
    whole = HEAD + events + DONE
    sc = SseScanner(keep_usage_chunk=True, drop_cached=drop)
    if split is None:
        out = sc.feed(whole)
    else:
        out = b"".join(sc.feed(whole[i:i + split]) for i in range(0, len(whole), split))
    out += sc.finish()
    assert out.startswith(HEAD) and out.endswith(DONE)
    return out[len(HEAD):-len(DONE)]


def event_of(payload: bytes) -> bytes:
    """``payload`` as one data event, one ``data:`` line per line of it (a client joins them with LF)."""
    return b"".join(b"data: " + line + b"\n" for line in payload.split(b"\n")) + b"\n"


def payload_of(event: bytes) -> bytes:
    """The data of one forwarded event (its ``data:`` lines joined with LF)."""
    lines = [ln for ln in event.split(b"\n") if ln.startswith(b"data:")]
    return b"\n".join(ln[6:] if ln[5:6] == b" " else ln[5:] for ln in lines)


@pytest.mark.parametrize("data", [NESTED, NESTED_ONLY, NESTED_ESCAPED])
def test_plain_nested_counter_does_not_go_out(data: bytes) -> None:
    assert "cached_tokens" in _pairs_keys(data)  # the shape does carry it
    out = plain_for_drop(data)
    assert "cached_tokens" not in _pairs_keys(out)  # before: NESTED, NESTED_ONLY, NESTED_ESCAPED as received
    assert orjson.loads(out) == _reference(orjson.loads(data))


@pytest.mark.parametrize("data", [NESTED, NESTED_ONLY, NESTED_ESCAPED])
@pytest.mark.parametrize("split", [None, 1, 5])
def test_stream_nested_counter_does_not_go_out(data: bytes, split: int | None) -> None:
    out = stream_for(b"event: delta\nid: 9\n" + event_of(data), split=split)
    assert out.startswith(b"event: delta\nid: 9\ndata: ")  # the event's type and id stay (RV2-5)
    assert "cached_tokens" not in _pairs_keys(payload_of(out))  # before: forwarded as received
    assert orjson.loads(payload_of(out)) == _reference(orjson.loads(data))
    assert stream_for(event_of(data), drop=False, split=split) == event_of(data)  # pass: as received


def test_without_counter_keeps_order_depth_and_other_keys() -> None:
    obj = {"b": 1, "prompt_tokens_details": {"cached_tokens": 1}, "a": [{"cached_tokens": 2, "k": [[{}]]}],
           "d": {"prompt_tokens_details": {"cached_tokens": 3, "audio_tokens": 0}}, "s": "cached_tokens"}
    out = without_counter(obj)
    assert list(out) == ["b", "a", "d", "s"]
    assert out == {"b": 1, "a": [{"k": [[{}]]}], "d": {"prompt_tokens_details": {"audio_tokens": 0}},
                   "s": "cached_tokens"}
    assert obj["a"][0]["cached_tokens"] == 2  # a copy: the gateway's own readers keep the parse
    deep: Any = {"cached_tokens": 1}
    for _ in range(3000):  # deeper than the interpreter's recursion limit: no RecursionError
        deep = {"x": [deep]}
    stripped = without_counter(deep)
    for _ in range(3000):
        stripped = stripped["x"][0]
    assert stripped == {}


def test_events_that_name_nothing_go_out_as_received() -> None:
    payload = b'{"choices":[{"index":0,"text":"\\n no counter here","usage":{"prompt_tokens":1}}]}'
    assert event_for_drop(payload, orjson.loads(payload)) is None
    assert stream_for(event_of(payload)) == event_of(payload)


# --- the property over nested shapes


_NAMES = ["cached_tokens", "prompt_tokens_details", "usage", "choices", "text", "index", "audio_tokens", "x"]
_SCALARS = st.sampled_from([b"0", b"7", b"-1", b"1.5e3", b"true", b"null", b'"ok"', b'"cached_tokens"',
                            b'"\\u00e9t\\u00e9"', b'"a\\"cached_tokens\\":1"', b'"\\\\u005f"', b'"\\n"'])
_WS = st.sampled_from([b"", b"", b" ", b"\n", b"\r\n  "])


@st.composite
def _key(draw: Any) -> bytes:
    """A key, some of its characters written as ``\\uXXXX`` (upper or lower hex)."""
    name = draw(st.sampled_from(_NAMES))
    out = []
    for ch in name:
        k = draw(st.integers(0, 11))
        out.append(f"\\u{ord(ch):04x}" if k == 0 else f"\\u{ord(ch):04X}" if k == 1 else ch)
    return b'"' + "".join(out).encode() + b'"'


def _objects(children: Any) -> Any:
    pair = st.tuples(_key(), _WS, children)
    return st.tuples(st.lists(pair, max_size=4), _WS).map(
        lambda t: b"{" + t[1] + b",".join(k + w + b":" + v for k, w, v in t[0]) + b"}")


def _arrays(children: Any) -> Any:
    return st.tuples(st.lists(children, max_size=3), _WS).map(lambda t: b"[" + t[1] + (b"," + t[1]).join(t[0]) + b"]")


_TREES = st.recursive(_SCALARS, lambda c: st.one_of(_objects(c), _arrays(c)), max_leaves=14)


@st.composite
def answers(draw: Any) -> bytes:
    """A top-level JSON object: random pairs, often beside vLLM's top-level usage, sometimes in the
    review's shape (a per-choice usage holding the counter)."""
    pairs = draw(st.lists(st.tuples(_key(), _TREES), max_size=4))
    if draw(st.booleans()):
        pairs.append((b'"usage"', b'{"prompt_tokens":5,"prompt_tokens_details":{"cached_tokens":3}}'))
    if draw(st.booleans()):
        choice = b'{"index":0,"text":"ok","usage":{"prompt_tokens_details":{' + draw(_key()) + b":7}}}"
        pairs.append((b'"choices"', b"[" + choice + b"]"))
    pairs = draw(st.permutations(pairs))
    sep = draw(_WS)
    return b"{" + sep + (b"," + sep).join(k + b":" + v for k, v in pairs) + b"}"


def _check(data: bytes, out: bytes) -> None:
    assert "cached_tokens" not in _pairs_keys(out)
    assert json.loads(out) == _reference(json.loads(data))  # the last-value parse: everything else kept
    if not may_name_cached(data):
        assert out == data  # named nothing: as received


@settings(max_examples=700, deadline=None)
@given(answers(), st.sampled_from([None, 1, 3, 64]))
def test_no_counter_in_any_spelling_reaches_a_drop_tenant(data: bytes, split: int | None) -> None:
    _check(data, plain_for_drop(data))
    out = stream_for(event_of(data), split=split)
    assert out.endswith(b"\n\n") and out.count(b"\n\n") == 1  # one event out for one event in
    _check(data, payload_of(out) if out != event_of(data) else data)


# --- end to end: a replica sending the review's shapes to a drop tenant (the default)


Fake = PlainFake
n_replicas = fake_replicas.n_replicas  # fixture: the stack's simulated cluster is not used (one replica)


SHAPES = {"nested": NESTED, "nested-only": NESTED_ONLY, "nested-escaped": NESTED_ESCAPED}
#: S15-6: 1,002 levels (orjson parses up to 1,024), the counter at the bottom: too deep to write again
DEEP = b'{"id":"x","d":' + b"[" * 1000 + b'{"cached_tokens":7}' + b"]" * 1000 + b"}"


def _app(fake: Fake) -> web.Application:
    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        word = body["prompt"].split(" ")[0]  # the shape's name, then maybe a marker (PROMPT_MARK)
        shape = DEEP if word == "deep" else SHAPES[word]
        if not body.get("stream"):
            return web.Response(body=shape, content_type="application/json")
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"text":"ok"}]}\n\n')
        await resp.write(b"data: " + shape + b"\n\n")
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


@pytest.mark.parametrize("prompt", sorted(SHAPES))
async def test_a_drop_tenant_reads_no_nested_counter_end_to_end(stack: Any, fakes: list[Fake], prompt: str) -> None:
    r = await stack.client.post("/v1/completions", json=completion(prompt), headers=stack.auth("tenant-a/app"))
    assert r.status_code == 200, r.text
    assert "cached_tokens" not in _pairs_keys(r.content)  # before: the replica's bytes
    assert r.json() == _reference(json.loads(SHAPES[prompt]))
    assert r.headers["content-length"] == str(len(r.content))
    async with stack.client.stream("POST", "/v1/completions", json=completion(prompt, stream=True),
                                   headers=stack.auth("tenant-a/app")) as s:
        assert s.status_code == 200
        got = b"".join([part async for part in s.aiter_bytes()])
    events = [e for e in got.split(b"\n\n") if e and e != b"data: [DONE]"]
    assert len(events) == 2
    assert "cached_tokens" not in _pairs_keys(payload_of(events[1]))
    assert json.loads(payload_of(events[1])) == _reference(json.loads(SHAPES[prompt]))


audit_hub, audit_log = audit_fixtures.audit_hub, audit_fixtures.audit_log  # fixtures: the stack on a ListLog
#: in the prompts of the S15-6 tests only: no audit event may hold it (the gateway never logs prompt text)
PROMPT_MARK = "s16-prompt-text-mark"


async def failure_event(log: ListLog, request_id: str) -> Any:
    """The one audit event of ``request_id`` (waited for: it is emitted as the request ends)."""
    events = await wait_for(lambda: [e for e in log.events if getattr(e, "request_id", None) == request_id],
                            what=f"the audit event of {request_id}")
    assert len(events) == 1, events
    return events[0]


def assert_replica_failure_audited(event: Any, request_id: str) -> None:
    """S16 (S15-6's tests did not look at the audit): the 502's event as the client saw it, no prompt text."""
    assert event.request_id == request_id
    assert event.status_code == 502 and event.error_code == "upstream_error"
    assert event.outcome.value == "failed", event.outcome
    assert event.tenant == "tenant-a" and event.endpoint == "/v1/completions"
    assert PROMPT_MARK not in json.dumps(event.to_dict())


async def test_an_answer_that_cannot_be_written_again_is_a_replica_failure(
        stack: Any, fakes: list[Fake], audit_log: ListLog, monkeypatch: pytest.MonkeyPatch) -> None:
    """S15-6: a rewrite that raises (``RecursionError`` on an answer nested ~1,000 deep, where the stack
    allows less) was outside the answer's error mapping; now 502 ``upstream_error`` with the request's id,
    audited with that status, code and id (no prompt text), the counter not relayed, and the gateway serves
    the next request."""
    import gateway.pipeline_answer as pipeline_answer

    def too_deep(*_: Any) -> bytes:
        raise RecursionError("maximum recursion depth exceeded while encoding a JSON object")

    monkeypatch.setattr(pipeline_answer, "plain_without_cached", too_deep)
    r = await stack.client.post("/v1/completions", json=completion(f"nested {PROMPT_MARK}"),
                                headers=stack.auth("tenant-a/app"))
    assert r.status_code == 502, r.text
    assert r.json()["error"]["code"] == "upstream_error"
    assert b"cached_tokens" not in r.content and r.headers["x-request-id"]
    assert_replica_failure_audited(await failure_event(audit_log, r.headers["x-request-id"]), r.headers["x-request-id"])
    monkeypatch.undo()
    r = await stack.client.post("/v1/completions", json=completion("nested"), headers=stack.auth("tenant-a/app"))
    assert r.status_code == 200, r.text


async def test_a_deep_answer_never_relays_the_counter(stack: Any, fakes: list[Fake], audit_log: ListLog) -> None:
    """1,002 levels (orjson parses up to 1,024), the counter at the bottom: written again without it, or,
    where the stack is too shallow to write it again, 502 ``upstream_error`` (audited as such); never the
    counter."""
    r = await stack.client.post("/v1/completions", json=completion(f"deep {PROMPT_MARK}"),
                                headers=stack.auth("tenant-a/app"))
    assert b"cached_tokens" not in r.content
    event = await failure_event(audit_log, r.headers["x-request-id"])
    if r.status_code == 200:
        assert r.content == DEEP.replace(b'{"cached_tokens":7}', b"{}")
        assert event.status_code == 200 and event.error_code is None
        assert PROMPT_MARK not in json.dumps(event.to_dict())
    else:
        assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_error", r.text
        assert_replica_failure_audited(event, r.headers["x-request-id"])
