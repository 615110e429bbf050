"""Session 14 (issue 14): the audit worker takes its input in bursts and runs as a batch process.

* ``build_audit(input_batched=True)`` (what the worker calls): the file and syslog sinks send each burst at
  once (``linger_s`` 0), the OTLP log sink keeps its linger; without it every sink keeps its own.
* A burst emitted at once is sent by those sinks in one batch each, before the next burst comes.
* ``audit.worker.batch_scheduling`` puts the process under ``SCHED_BATCH`` (checked in a child process:
  the test runner's own policy is left alone).
"""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from audit.config import build_audit
from audit.keys import generate_signing_key
from audit.worker_stdin import READ_INTERVAL_S

REPO = Path(__file__).resolve().parents[2]


def _config(tmp_path: Path) -> dict[str, Any]:
    generate_signing_key(tmp_path / "audit.key")
    return {"jsonl": {"dir": str(tmp_path / "log"), "signing_key_file": str(tmp_path / "audit.key")},
            "ocsf": {"file": str(tmp_path / "ocsf.jsonl")},
            "syslog": {"host": "127.0.0.1", "port": 9, "protocol": "udp"},
            "otlp": {"endpoint": "http://127.0.0.1:9/v1/logs"},
            "spill": {"dir": str(tmp_path / "spill")}}


@pytest.mark.parametrize("batched", [False, True])
def test_input_batched_sends_the_burst_at_once_except_otlp(tmp_path: Path, batched: bool) -> None:
    log = build_audit(_config(tmp_path), input_batched=batched)
    assert log is not None
    lingers = {w.sink.name: w.sink.linger_s for w in log._workers}  # noqa: SLF001 - test
    assert lingers["otlp"] == 0.5
    for name in ("jsonl", "ocsf", "syslog"):
        assert (lingers[name] == 0.0) is batched, (name, lingers)


def test_a_burst_leaves_in_one_write_per_file_sink(tmp_path: Path) -> None:
    """Two bursts of 40 events, emitted as the worker emits a read's frames: each file sink sends each
    burst in one batch (so one write), and every event is in every file."""
    from audit.event import AuditEvent, Kind, Outcome
    from audit.jsonl import list_log_files

    cfg = _config(tmp_path)
    del cfg["syslog"], cfg["otlp"]

    async def go() -> dict[str, list[int]]:
        log = build_audit(cfg, input_batched=True)
        assert log is not None
        await log.start()
        batches: dict[str, list[int]] = {}
        for w in log._workers:  # noqa: SLF001 - test: count each sink's batches
            send = w.sink.send

            async def counted(events: list[AuditEvent], send: Any = send, name: str = w.sink.name) -> None:
                batches.setdefault(name, []).append(len(events))
                await send(events)

            w.sink.send = counted
        for burst in range(2):
            for i in range(40):
                log.emit(AuditEvent(kind=Kind.INFERENCE, outcome=Outcome.ALLOWED, request_id=f"b{burst}-{i}"))
            assert await log.drain(5)
        await log.close()
        return batches

    batches = asyncio.run(go())
    assert batches["jsonl"][:2] == [40, 40] and batches["ocsf"][:2] == [40, 40]
    text = "".join(p.read_text() for p in list_log_files(tmp_path / "log"))
    ocsf = (tmp_path / "ocsf.jsonl").read_text()
    for burst in range(2):
        for i in range(40):
            assert f'"b{burst}-{i}"' in text and f'"b{burst}-{i}"' in ocsf


def test_read_interval_is_bounded() -> None:
    assert 0 < READ_INTERVAL_S <= 0.05  # docs/audit.md: a frame waits at most 50 ms in the pipe


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux only")
def test_batch_scheduling_in_a_child() -> None:
    code = ("import os; from audit.worker import batch_scheduling; ok = batch_scheduling(); "
            "print(ok, os.sched_getscheduler(0) == os.SCHED_BATCH, os.nice(0))")
    nice0 = os.nice(0)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=str(REPO), env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=60).stdout.split()
    assert out[0] == "True" and out[1] == "True"
    assert int(out[2]) == nice0  # the same nice value: the same CPU share
