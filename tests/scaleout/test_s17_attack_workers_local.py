"""Session 17, helper attack (S17-2): ``serve --workers N`` with ``state.on_unavailable: local`` and the
default ``state.instances_expected`` (1).

During a Redis outage each process enforces every tenant's limits divided by ``instances_expected``
(tenancy/shared_failover.py ``scaled_tenant``). ``serve --workers N`` knows it starts N processes on this
host, yet starts them all with the divisor 1 (gateway/workers.py ``worker_config`` leaves ``state``
alone; gateway/cli.py ``serving_refusal`` looks at the backend only): an honest operator who adds
``--workers 4`` to a ``local`` configuration gives every tenant 4 x its rate, burst and concurrency for
as long as Redis is away, silently. The gateway is never started here: ``run_workers`` is replaced.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import gateway.workers
from gateway.cli import main as prefixgate
from tenancy.registry import Tenant
from tenancy.shared_failover import scaled_tenant


def _serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: dict, workers: int) -> tuple[object, list]:
    monkeypatch.setenv("GOGC", os.environ.get("GOGC", "800"))  # no re-exec inside the test process
    started: list = []
    monkeypatch.setattr(gateway.workers, "run_workers", lambda cfg, path, n: started.append((cfg, n)) or 0)
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(yaml.safe_dump({"state": state}))
    return CliRunner().invoke(prefixgate, ["serve", "--config", str(cfg), "--workers", str(workers)]), started


def test_the_divisor_is_what_local_mode_enforces() -> None:
    """What holds: with the right divisor the processes together admit one tenant's limit."""
    t = Tenant(id="acme", rate_rps=40.0, rate_burst=40.0, max_concurrency=8)
    s = scaled_tenant(t, 4)
    assert (s.rate_rps, s.rate_burst, s.max_concurrency) == (10.0, 10.0, 2)
    assert scaled_tenant(t, 1) is t  # the default divisor: every process gets the whole limit


def test_workers_above_instances_expected_in_local_mode_are_refused_or_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    state = {"backend": "redis", "url": "redis://127.0.0.1:9/0", "on_unavailable": "local"}
    res, started = _serve(tmp_path, monkeypatch, state, 4)
    said = (getattr(res, "output", "") or "") + caplog.text
    refused = getattr(res, "exit_code", 0) != 0 and not started
    divisor_ok = bool(started) and started[0][0].state.instances_expected >= 4
    assert refused or divisor_ok or "instances_expected" in said, (res.exit_code, said)


def test_workers_above_flow_instances_are_refused_or_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    monkeypatch.setenv("GOGC", os.environ.get("GOGC", "800"))
    started: list = []
    monkeypatch.setattr(gateway.workers, "run_workers", lambda cfg, path, n: started.append((cfg, n)) or 0)
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(yaml.safe_dump({"state": {"backend": "redis", "url": "redis://127.0.0.1:9/0"},
                                   "flow": {"replica_max_queued_prefill_tokens": 16384}}))
    res = CliRunner().invoke(prefixgate, ["serve", "--config", str(cfg), "--workers", "4"])
    said = (res.output or "") + caplog.text
    refused = res.exit_code != 0 and not started
    divisor_ok = bool(started) and started[0][0].flow.instances >= 4
    assert refused or divisor_ok or "flow.instances" in said, (res.exit_code, said)
