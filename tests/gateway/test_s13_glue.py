"""Session 13 (issue 14, the pipeline's glue): on a kept-alive connection of the guarded listener the
pipeline schedules its replica-wait work on the loop noted in the connection's ConnectionLoss, with no
running-loop lookup per request (each one is a ``getpid`` system call on CPython 3.11); the work still
runs after the upstream request was written and before the answer is read; outside the guarded
listener (no ConnectionLoss in the scope) the running loop was looked up as before. Session 31: the work runs in
the write's loop step (tests/gateway/test_s31_prep_after_write.py), so no lookup is made on either listener."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from gateway.app import build_public_app
from gateway.client_io import LOSS_KEY, ConnectionLoss, scope_loop
from gateway.upstream_conn import UpstreamConnection
from tests.conftest import Stack
from tests.gateway.test_s2_record_after_send import _scope
from tests.support.spies import log_calls

BODY = json.dumps({"model": "sim-model", "prompt": "one two three four five six seven eight nine ten eleven "
                   "twelve thirteen fourteen fifteen sixteen seventeen", "max_tokens": 2}).encode()


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Replace ``asyncio.get_running_loop`` by a counting one; returns the callers' file names."""
    callers: list[str] = []
    real = asyncio.get_running_loop

    def counting() -> asyncio.AbstractEventLoop:
        callers.append(sys._getframe(1).f_code.co_filename)
        return real()

    monkeypatch.setattr(asyncio, "get_running_loop", counting)
    return callers


async def test_scope_loop_notes_the_connection_loop_once(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    loss = ConnectionLoss()
    scope = {LOSS_KEY: loss}
    callers = _counting(monkeypatch)
    assert scope_loop(scope) is loop and loss.loop is loop
    assert scope_loop(scope) is loop and scope_loop(scope) is loop
    assert len(callers) == 1  # looked up at the connection's first use only
    assert scope_loop({}) is loop and len(callers) == 2  # no guarded listener: looked up each time


def test_scope_loop_outside_a_loop_raises() -> None:
    with pytest.raises(RuntimeError):
        scope_loop({})
    with pytest.raises(RuntimeError):
        scope_loop({LOSS_KEY: ConnectionLoss()})


async def _serve(stack: Stack, app: Any, loss: ConnectionLoss | None, log: list[str]) -> int:
    scope = _scope("/v1/completions", stack.auth())
    if loss is not None:
        scope[LOSS_KEY] = loss
    messages = [{"type": "http.request", "body": BODY, "more_body": False}]
    status: list[int] = []

    async def receive() -> dict[str, Any]:
        if not messages:  # the client stays: nothing more arrives
            await asyncio.Event().wait()
        return messages.pop(0)

    async def send(message: dict[str, Any]) -> None:
        log.append(message["type"])
        if message["type"] == "http.response.start":
            status.append(message["status"])

    await app(scope, receive, send)
    return status[0]


@pytest.mark.parametrize("guarded", [True, False])
async def test_the_wait_work_is_scheduled_without_a_loop_lookup_per_request(
        stack: Stack, monkeypatch: pytest.MonkeyPatch, guarded: bool) -> None:
    gw = stack.components
    app = build_public_app(gw, manage_lifecycle=False)
    loss = ConnectionLoss() if guarded else None
    log: list[str] = []
    for _ in range(4):  # kept-alive upstream connections, the connection's loop noted
        assert await _serve(stack, app, loss, log) == 200
    log_calls(gw.audit, "prepare_request", log, "prepared", monkeypatch)
    log_calls(UpstreamConnection, "send", log, "upstream written", monkeypatch)
    log.clear()
    callers = _counting(monkeypatch)
    assert await _serve(stack, app, loss, log) == 200
    from_pipeline = [c for c in callers if c.endswith(("gateway/pipeline.py", "gateway/client_io.py"))]
    # none (session 31: the wait work runs in the write's step, no loop callback; before, outside the guarded
    # listener, one lookup per request)
    assert not from_pipeline, callers
    # still after the upstream write, before the answer starts
    assert log.index("upstream written") < log.index("prepared") < log.index("http.response.start"), log
    assert log.count("prepared") == 1
