"""Session 5 (issue 14): the audit worker process runs on uvloop, as the gateway does (one wake
per answer: ~175 -> ~135 us of worker CPU per event on the shared 2-core machine)."""
from __future__ import annotations

import asyncio
import signal
from typing import Any

import pytest

import audit.worker as worker


def test_the_worker_runs_its_protocol_on_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    uvloop = pytest.importorskip("uvloop")
    seen: list[Any] = []

    async def fake_run() -> int:
        seen.append(type(asyncio.get_running_loop()))
        return 7

    monkeypatch.setattr(worker, "run", fake_run)
    monkeypatch.setattr(signal, "signal", lambda *a: None)  # main() ignores SIGINT/SIGTERM: not in the test process
    assert worker.main() == 7
    assert seen == [uvloop.Loop]
