"""Issue 11 item 7: a registry reload frees the limiter state of removed tenants."""
from __future__ import annotations

import os
import secrets
from pathlib import Path

import yaml

from gateway.auditing import AuditHub
from gateway.build import build
from gateway.config import GatewayConfig
from sim.spiffe_issuer import DemoIssuer

ROOT = Path(__file__).resolve().parents[2]
TD = "demo.prefixgate.test"


def _tenant(tid: str) -> dict:
    return {"id": tid, "spiffe_ids": [f"spiffe://{TD}/{tid}/"], "models": ["sim-model"], "pools": ["default"],
            "rate_rps": 1, "rate_burst": 1}


def _config(tmp_path: Path, tenants: list[str]) -> GatewayConfig:
    secret = tmp_path / "master.key"
    if not secret.exists():
        secret.write_text(secrets.token_hex(32))
        os.chmod(secret, 0o600)
        DemoIssuer(TD).write_bundle(tmp_path / "bundle.json")
    return GatewayConfig.model_validate({
        "listen": {"host": "127.0.0.1", "port": 0}, "admin": None,
        "replicas": [{"id": "r0", "url": "http://127.0.0.1:9", "pool": "default"}],
        "tenancy": {"master_secret_file": str(secret), "master_secret_env": None,
                    "tenants": [_tenant(t) for t in tenants]},
        "identity": {"audience": "prefixgate", "trust_domains": {TD: {"bundle_file": str(tmp_path / "bundle.json")}}},
        "policy": {"mode": "embedded", "dir": str(ROOT / "rego")},
    })


def test_reload_frees_removed_tenants_state(tmp_path: Path) -> None:
    cfg_file = tmp_path / "gateway.yaml"
    cfg = _config(tmp_path, ["tenant-a", "tenant-b", "tenant-c"])
    c = build(cfg, audit=AuditHub(None), config_path=str(cfg_file))
    for tid in ("tenant-a", "tenant-b", "tenant-c"):
        c.limiter.admit(c.registry.get(tid), now=0.0).release()
    held = c.limiter.admit(c.registry.get("tenant-c"), now=5.0)  # still in flight at the reload
    assert len(c.limiter) == 3
    cfg_file.write_text(yaml.safe_dump(_config(tmp_path, ["tenant-a"]).model_dump(mode="json", exclude_none=True)))
    c.admin.reload_registry()
    assert len(c.limiter) == 2  # tenant-b freed; tenant-c kept while its request is in flight
    assert c.limiter.in_flight("tenant-c") == 1
    held.release()
    c.admin.reload_registry()
    assert len(c.limiter) == 1 and c.limiter.in_flight("tenant-a") == 0
