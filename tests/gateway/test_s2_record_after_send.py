"""Issue 14: the inference routes are served without Starlette's per-request
routing, and a request's metrics are written after its answer was handed to
the server; issue 16: its audit event is emitted (and handed to the audit
worker) just before the answer's last body part — each exactly once, however
the call ended.

The public app is called as ASGI directly (the stack's components, real
replicas), with a ``send`` that logs what went out, and spies on the audit
hub's ``emit_request`` (the event) and ``observe_request`` (the after-answer
step, with the metrics) that log when each ran.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gateway.app import build_public_app
from tests.conftest import Stack

BODY = json.dumps({"model": "sim-model", "prompt": "one two three", "max_tokens": 2}).encode()


def _scope(path: str, headers: dict[str, str], method: str = "POST") -> dict[str, Any]:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    raw.append((b"content-length", str(len(BODY)).encode()))
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
            "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": raw, "client": ("127.0.0.1", 5555), "server": ("127.0.0.1", 80)}


async def _call(stack: Stack, monkeypatch: pytest.MonkeyPatch, scope: dict[str, Any],
                fail_send: bool = False) -> tuple[list[str], list[dict[str, Any]]]:
    log: list[str] = []
    sent: list[dict[str, Any]] = []
    hub = stack.components.audit
    real_emit, real_observe = hub.emit_request, hub.observe_request

    def spy_emit(rec: Any) -> None:
        log.append(f"audited {rec.status}")
        real_emit(rec)

    def spy_observe(rec: Any) -> None:
        log.append(f"recorded {rec.status}")
        real_observe(rec)

    monkeypatch.setattr(hub, "emit_request", spy_emit)
    monkeypatch.setattr(hub, "observe_request", spy_observe)
    app = build_public_app(stack.components, manage_lifecycle=False)
    messages = [{"type": "http.request", "body": BODY, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await __import__("asyncio").Event().wait()  # never: the client stays
        raise AssertionError

    async def send(message: dict[str, Any]) -> None:
        if fail_send:
            log.append("send failed")
            raise OSError("client gone")
        sent.append(message)
        log.append(message["type"])

    try:
        await app(scope, receive, send)
    except OSError:
        assert fail_send
    return log, sent


async def test_answer_goes_out_before_the_record(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    log, sent = await _call(stack, monkeypatch, _scope("/v1/completions", stack.auth()))
    assert sent[0]["status"] == 200
    assert log == ["http.response.start", "audited 200", "http.response.body", "recorded 200"]


async def test_refusal_goes_out_before_the_record(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    log, sent = await _call(stack, monkeypatch, _scope("/v1/chat/completions", {}))
    assert sent[0]["status"] == 401
    assert json.loads(sent[1]["body"])["error"]["code"] == "missing_token"
    assert log == ["http.response.start", "audited 401", "http.response.body", "recorded 401"]


async def test_record_written_once_when_the_answer_cannot_be_sent(stack: Stack,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    log, _ = await _call(stack, monkeypatch, _scope("/v1/completions", stack.auth()), fail_send=True)
    assert log == ["send failed", "audited 200", "recorded 200"]


async def test_other_routes_still_answer_through_starlette(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    log, sent = await _call(stack, monkeypatch, _scope("/v1/completions", stack.auth(), method="GET"))
    assert sent[0]["status"] == 405 and json.loads(sent[1]["body"])["error"]["code"] == "method_not_allowed"
    log, sent = await _call(stack, monkeypatch, _scope("/v1/completions/", stack.auth()))
    # R4-4 (session 4): an unrouted request is audited too, by Starlette's 404 handler before its
    # answer (not the pipeline's after-send path), once
    assert sent[0]["status"] == 404
    assert log == ["audited 404", "recorded 404", "http.response.start", "http.response.body"]
