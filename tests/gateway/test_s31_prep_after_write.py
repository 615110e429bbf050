"""Session 31 (issue 14, cut31): the replica-wait work (``InferencePipeline._prepare``: the ledger's lowered hold,
the record's fingerprint, the audit event's span part, the router's index record) runs right after the upstream
request is written, in the same loop step, before the pipeline awaits the answer. Before, it was a loop callback
(``call_soon``): one more event-loop turn, with its ``epoll_wait``, per request. Still once, still after the write and
before the answer; a bug in it is logged with the request's id and the request is answered and recorded."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from gateway.app import build_public_app
from gateway.client_io import ConnectionLoss
from gateway.upstream_conn import UpstreamConnection
from tests.conftest import Stack
from tests.gateway.test_s13_glue import _serve as serve_on_connection
from tests.support.spies import log_calls

async def _serve(stack: Stack, app: Any, log: list[str]) -> int:
    """One served request on a connection that stays (tests/gateway/test_s13_glue.py's helper, a live connection)."""
    return await serve_on_connection(stack, app, ConnectionLoss(), log)


def _mark_next_turn(log: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """At each upstream write, schedule a loop callback that logs ``"next loop turn"``."""
    real = UpstreamConnection.send

    def send(self: UpstreamConnection, *a: Any, **kw: Any) -> Any:
        out = real(self, *a, **kw)
        log.append("upstream written")
        asyncio.get_running_loop().call_soon(log.append, "next loop turn")
        return out

    monkeypatch.setattr(UpstreamConnection, "send", send)


async def test_the_wait_work_runs_in_the_write_step_once(stack: Stack, monkeypatch: pytest.MonkeyPatch) -> None:
    gw = stack.components
    app = build_public_app(gw, manage_lifecycle=False)
    log: list[str] = []
    for _ in range(3):  # kept-alive upstream connections: the request is written before open_upstream returns
        assert await _serve(stack, app, log) == 200
    log_calls(gw.audit, "prepare_request", log, "prepared", monkeypatch)
    log_calls(gw.router, "settle", log, "index applied", monkeypatch)
    _mark_next_turn(log, monkeypatch)
    log.clear()
    assert await _serve(stack, app, log) == 200
    assert log.count("prepared") == 1, log
    # after the write, in its loop step (before any callback scheduled at the write), before the answer
    assert (log.index("upstream written") < log.index("prepared") < log.index("index applied")
            < log.index("next loop turn") < log.index("http.response.start")), log


async def test_a_bug_in_the_wait_work_is_logged_and_the_request_answered(
        stack: Stack, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    gw = stack.components
    app = build_public_app(gw, manage_lifecycle=False)
    log: list[str] = []
    assert await _serve(stack, app, log) == 200  # a kept-alive connection
    emitted: list[Any] = []
    log_calls(gw.audit, "emit_request", emitted, "recorded", monkeypatch)

    def broken(rec: Any) -> None:
        raise RuntimeError("QQQ a bug")

    monkeypatch.setattr(gw.audit, "prepare_request", broken)
    with caplog.at_level(logging.ERROR, logger="prefixgate"):
        assert await _serve(stack, app, log) == 200
    assert emitted == ["recorded"]  # its one audit event
    assert any(r.getMessage().startswith("preparing the record of request ") for r in caplog.records), caplog.text
