"""An error answer's body is rendered once per distinct error and reused: the bytes, status,
headers and media type are exactly what a fresh :class:`JSONResponse` gives."""

from __future__ import annotations

from starlette.responses import JSONResponse

from gateway import errors
from gateway.errors import GatewayError


def _same(err: GatewayError) -> None:
    ref = JSONResponse(err.body(), status_code=err.status, headers=err.headers)
    for _ in range(2):  # rendered, then from memory
        got = err.response()
        assert (got.body, got.status_code, got.raw_headers) == (ref.body, ref.status_code, ref.raw_headers)


def test_reused_bodies_are_byte_identical() -> None:
    _same(GatewayError(429, "queue_full", "this tenant has too many requests waiting; retry later",
                       headers={"Retry-After": "30"}, outcome="rate_limited"))
    _same(GatewayError(429, "queue_full", "this tenant has too many requests waiting; retry later",
                       headers={"Retry-After": "2"}))  # same body, other header
    _same(GatewayError(400, "bad", "ünïcödé \u2028 \"quoted\" \\ <tag>", param="messages"))
    _same(GatewayError(403, "denied", "no", extra={"decision_id": "d-1"}))  # extra: never reused


def test_the_memory_is_bounded(monkeypatch) -> None:
    monkeypatch.setattr(errors, "_BODIES_MAX", 4)
    monkeypatch.setattr(errors, "_BODIES", {})
    for i in range(20):
        GatewayError(400, f"c{i}", "m").response()
    assert len(errors._BODIES) <= 4
