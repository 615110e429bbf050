"""Fixtures for replica- and client-fault tests: small upstream timeouts, a fast health
checker and circuit breaker, a recording audit hub, and helpers to fault, kill and
restart simulated replicas (r0, r1: pool ``default``; r2: pool ``eu``)."""

from __future__ import annotations

import dataclasses
import os
import secrets
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.auditing import AuditHub
from sim.replica import ReplicaConfig, create_app, run_app_on
from tests.support.waiting import wait_for


class RecordingHub(AuditHub):
    """An audit hub without sinks that keeps (request_id, outcome, status, error_code, attempts, replica)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.records: list[dict[str, Any]] = []

    def emit_request(self, rec: Any) -> None:
        self.records.append({"request_id": rec.request_id, "outcome": rec.outcome, "status": rec.status,
                             "error_code": rec.error_code, "attempts": rec.attempts, "replica": rec.replica,
                             "tenant": rec.tenant_id})
        super().emit_request(rec)


@pytest.fixture
def audit_hub() -> RecordingHub:
    return RecordingHub()


@pytest.fixture
def stable_secret(tmp_path: Path) -> str:
    """A master-secret file the loader always accepts (64 hex characters): tests/conftest.py
    writes 32 random bytes and the loader strips one trailing newline, so about one stack
    in 256 (random bytes ending in ``\\n``) fails to start with "too short"."""
    path = tmp_path / "master-stable.key"
    path.write_text(secrets.token_hex(32))
    os.chmod(path, 0o600)
    return str(path)


@pytest.fixture
def config_overrides(stable_secret: str) -> dict[str, Any]:
    return {
        # the replicas' cached_tokens reach the client (the default drops them: review R12-1)
        "tenancy": {"master_secret_file": stable_secret, "usage_cached_tokens": "pass"},
        "upstream": {"connect_timeout_s": 0.5, "first_byte_timeout_s": 0.5, "read_timeout_s": 0.5,
                     "total_timeout_s": 2.0, "max_attempts": 2},
        # timeout_s: no test here makes /health hang (faults answer it with a status, or the replica
        # is killed: refused at once); a 0.3 s probe timed out whenever the shared event loop was held
        # that long on a loaded machine and, with unhealthy_after 1, marked a replica down mid-test
        # (503 no_replica instead of the answer under test)
        "health": {"interval_s": 0.1, "timeout_s": 2.0, "unhealthy_after": 1, "healthy_after": 1,
                   "breaker_failures": 2, "breaker_cooldown_s": 0.5},
    }


class Sim:
    """Control of the stack's simulated replicas by index (0 → r0 …)."""

    def __init__(self, stack: Any, replica_cfg: ReplicaConfig) -> None:
        self.stack = stack
        self.cfg = replica_cfg
        self.http = httpx.AsyncClient(timeout=5)

    async def fault(self, i: int, **spec: Any) -> None:
        r = await self.http.post(self.stack.cluster.urls[i] + "/sim/faults", json=spec)
        r.raise_for_status()

    async def stats(self, i: int) -> dict[str, Any]:
        return (await self.http.get(self.stack.cluster.urls[i] + "/sim/stats")).json()

    def counter(self, name: str, idx: tuple[int, ...] = (0, 1, 2)) -> int:
        """Sum of a :class:`sim.replica.ReplicaCounters` field over replicas ``idx``."""
        return sum(getattr(self.stack.cluster.states[i].counters, name) for i in idx)

    async def kill(self, i: int) -> None:
        """The replica dies: its listener closes and every open connection is aborted (RST)."""
        runner = self.stack.cluster.runners[i]
        server = runner.server
        for site in list(runner.sites):
            await site.stop()
        if server is not None:
            for handler in list(server.connections):
                if handler.transport is not None:
                    handler.transport.abort()
        await runner.cleanup()

    async def revive(self, i: int) -> None:
        """Start a fresh replica (new instance id, empty KV cache) on the dead one's port."""
        port = int(self.stack.cluster.urls[i].rsplit(":", 1)[1])
        app = create_app(dataclasses.replace(self.cfg, replica_id=f"replica-{i}"))
        runner, _ = await run_app_on(app, "127.0.0.1", port)
        self.stack.cluster.apps[i] = app
        self.stack.cluster.runners[i] = runner

    async def close(self) -> None:
        await self.http.aclose()


@pytest.fixture
async def sim(stack: Any, replica_cfg: ReplicaConfig) -> Any:
    s = Sim(stack, replica_cfg)
    try:
        yield s
    finally:
        await s.close()


@pytest.fixture
def until() -> Any:
    return wait_for

