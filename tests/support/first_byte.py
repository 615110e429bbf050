"""One inference request through the gateway's ASGI app with the calibration's first-byte observation
watched (session 16, A15-2; one copy since session 17: the in-process and the Redis-backed tests).

:func:`one_watched_request` sends ``body`` to ``/v1/completions`` of a running stack (``tests/conftest.py``)
and returns the request's record, each first-byte observation the calibration was fed with what the
app had sent by then, and the calibrating tracker's clock readings (the first: the dispatch).
"""

from __future__ import annotations

from typing import Any

import pytest

from gateway.app import build_public_app
from gateway.record import RequestRecord
from routing.calibration import CalibratingLoadTracker
from tests.gateway.test_s2_record_after_send import _scope

__all__ = ["one_watched_request"]


async def one_watched_request(stack: Any, monkeypatch: pytest.MonkeyPatch, body: bytes,
                              ) -> tuple[RequestRecord, list[tuple[float, str]], list[float]]:
    """``(record, observed, clock_readings)``: ``observed`` holds ``(ttft_s, what was sent last)`` per
    observation (``"before any part"``, an ASGI message type, or ``"last part"``). Raises AssertionError
    unless exactly one request was recorded."""
    gw = stack.components
    cal = gw.calibration
    tracker = gw.router.loads.inner
    assert cal is not None and isinstance(tracker, CalibratingLoadTracker)
    readings: list[float] = []
    real_clock = tracker.clock

    def clock() -> float:
        t = real_clock()
        readings.append(t)
        return t

    monkeypatch.setattr(tracker, "clock", clock)
    observed: list[tuple[float, str]] = []
    sent: list[str] = []
    real_observe = cal.observe_first_byte

    def observe(rid: str, u: float, q: float, ttft: float, *a: Any) -> None:
        observed.append((ttft, sent[-1] if sent else "before any part"))
        real_observe(rid, u, q, ttft, *a)

    monkeypatch.setattr(cal, "observe_first_byte", observe)
    records: list[RequestRecord] = []
    real_record = gw.recorder.record
    monkeypatch.setattr(gw.recorder, "record", lambda rec: (records.append(rec), real_record(rec)))
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append("last part" if message["type"] == "http.response.body" and not message.get("more_body")
                    else message["type"])

    scope = _scope("/v1/completions", stack.auth())
    scope["headers"] = [(k, v) for k, v in scope["headers"] if k != b"content-length"]
    scope["headers"].append((b"content-length", str(len(body)).encode()))
    await build_public_app(gw, manage_lifecycle=False)(scope, receive, send)
    assert len(records) == 1, records
    return records[0], observed, readings
