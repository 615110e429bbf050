"""A gateway whose start fails (e.g. its audit directory is in use) releases
what it had opened: the upstream HTTP session is closed, not leaked."""
from __future__ import annotations

import os
import secrets
from pathlib import Path

import pytest

from gateway.auditing import AuditHub
from gateway.build import build
from gateway.config import GatewayConfig
from sim.spiffe_issuer import DemoIssuer

ROOT = Path(__file__).resolve().parents[2]
TD = "demo.prefixgate.test"


class _FailingAudit(AuditHub):
    async def start(self) -> None:
        raise RuntimeError("audit directory in use (simulated)")


async def test_failed_start_closes_the_upstream_session(tmp_path: Path) -> None:
    secret = tmp_path / "master.key"
    secret.write_text(secrets.token_hex(32))
    os.chmod(secret, 0o600)
    bundle = tmp_path / "bundle.json"
    DemoIssuer(TD).write_bundle(bundle)
    cfg = GatewayConfig.model_validate({
        "listen": {"host": "127.0.0.1", "port": 0}, "admin": None,
        "replicas": [{"id": "r0", "url": "http://127.0.0.1:9", "pool": "default"}],
        "tenancy": {"master_secret_file": str(secret), "master_secret_env": None,
                    "tenants": [{"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"],
                                 "models": ["sim-model"], "pools": ["default"]}]},
        "identity": {"audience": "prefixgate", "trust_domains": {TD: {"bundle_file": str(bundle)}}},
        "policy": {"mode": "embedded", "dir": str(ROOT / "rego")},
    })
    c = build(cfg, audit=_FailingAudit(None))
    with pytest.raises(RuntimeError, match="in use"):
        await c.start()
    assert c.upstream.session is not None and c.upstream.session.closed
