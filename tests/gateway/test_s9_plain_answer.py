"""Issue 14, session 9: the plain answer is built without Starlette's header normalisation
(:class:`gateway.pipeline_answer.PlainAnswer`) and identity answers share one decoder
(:data:`gateway.proxy.IDENTITY`); both must be exactly what they replace."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from starlette.responses import Response

from gateway.pipeline_answer import PlainAnswer
from gateway.proxy import IDENTITY, BodyDecoder, decode_body
from gateway.record import new_request_id
from bench.gateway_cpu_ab import orders

_IDS = st.one_of(st.just(new_request_id()), st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=64))


async def _messages(resp: Response) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await resp({"type": "http", "method": "POST", "path": "/"}, receive, send)
    return sent


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=2048), request_id=_IDS)
def test_plain_answer_equals_starlette_response(body: bytes, request_id: str) -> None:
    ours = PlainAnswer(body, request_id)
    theirs = Response(body, media_type="application/json", headers={"X-Request-Id": request_id})
    assert ours.status_code == theirs.status_code == 200
    assert ours.raw_headers == theirs.raw_headers
    assert ours.body == theirs.body
    assert ours.background is None and ours.media_type == theirs.media_type
    assert dict(ours.headers) == dict(theirs.headers)
    assert type(ours).__call__ is Response.__call__  # sent by the routes' two-message path


async def test_plain_answer_sends_the_same_messages() -> None:
    body, rid = b'{"id":"x","usage":{"completion_tokens":1}}', new_request_id()
    assert await _messages(PlainAnswer(body, rid)) == await _messages(
        Response(body, media_type="application/json", headers={"X-Request-Id": rid}))


def test_plain_answers_do_not_share_their_header_list() -> None:
    a, b = PlainAnswer(b"{}", "a"), PlainAnswer(b"{}", "b")
    a.raw_headers.append((b"connection", b"close"))  # as the framing guard's copy would never do in place
    assert b.raw_headers == Response(b"{}", media_type="application/json", headers={"X-Request-Id": "b"}).raw_headers


@settings(max_examples=100, deadline=None)
@given(parts=st.lists(st.binary(max_size=256), max_size=8))
def test_shared_identity_decoder_is_stateless(parts: list[bytes]) -> None:
    fresh = BodyDecoder(None)
    for p in parts:
        assert IDENTITY.feed(p) == fresh.feed(p) == p
    assert IDENTITY.finish() == fresh.finish() == b""
    assert IDENTITY.coding is None and IDENTITY.total == 0 and IDENTITY.max_bytes == fresh.max_bytes
    assert decode_body(b"".join(parts), None) == b"".join(parts)


def test_cpu_ab_orders_cover_every_combination_every_four_rounds() -> None:
    seen = [orders(r) for r in range(8)]
    assert {(s[0], m[0]) for s, m in seen[:4]} == {(a, b) for a in ("this", "baseline") for b in ("this", "baseline")}
    assert all(sorted(s) == sorted(m) == ["baseline", "this"] for s, m in seen)
    assert [s[0] for s, _ in seen] == ["this", "baseline"] * 4
