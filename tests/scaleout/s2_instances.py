"""Several gateway instances built in one test process, sharing state through one redis-server
(``state.backend: redis``). Only their shared-state lifecycle is started unless a test starts
the whole gateway; replicas point at a closed port (nothing is proxied)."""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from gateway.auditing import AuditHub
from gateway.build import Gateway, build
from gateway.config import GatewayConfig, load_config
from sim.spiffe_issuer import DemoIssuer

ROOT = Path(__file__).resolve().parents[2]
TD = "demo.prefixgate.test"
PREFIX = "pgs2:"
REPLICAS = [f"r{i}" for i in range(4)]
#: mints the operators' and workloads' JWT-SVIDs; its bundle is every instance's trust bundle
ISSUER = DemoIssuer(TD)
OPERATOR = f"spiffe://{TD}/ops/admin"


def write_secret(path: Path) -> Path:
    """A 0600 master-secret file."""
    path.write_text(secrets.token_hex(32))
    os.chmod(path, 0o600)
    return path


def instance_doc(tmp: Path, n: int, redis_url: str, secret: Path, **state: Any) -> dict[str, Any]:
    """Instance ``n``'s configuration document: its own policy directory, versions, key-state file."""
    own = tmp / f"inst{n}"
    own.mkdir(exist_ok=True)
    bundle = tmp / "bundle.json"
    if not bundle.exists():
        ISSUER.write_bundle(bundle)
    policy_dir = own / "policy"
    if not policy_dir.exists():
        shutil.copytree(ROOT / "rego", policy_dir)
    return {
        "listen": {"host": "127.0.0.1", "port": 0}, "admin": {"host": "127.0.0.1", "port": 0},
        "routing": {"policy": "cache_aware", "block_size": 16},
        "replicas": [{"id": r, "url": "http://127.0.0.1:9", "pool": "default"} for r in REPLICAS],
        "tenancy": {"master_secret_file": str(secret), "master_secret_env": None,
                    "state_file": str(own / "keystate.json"),
                    "operators": [f"spiffe://{TD}/ops/admin"],
                    "tenants": [{"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"],
                                 "models": ["sim-model"], "pools": ["default"]}]},
        "identity": {"audience": "prefixgate", "trust_domains": {TD: {"bundle_file": str(bundle)}}},
        "policy": {"mode": "embedded", "dir": str(policy_dir), "versions_dir": str(own / "versions")},
        "state": {"backend": "redis", "url": redis_url, "key_prefix": PREFIX, "lease_ttl_s": 2.0,
                  "sync_poll_s": 1.0, **state},
    }


def instance_config(tmp: Path, n: int, redis_url: str, secret: Path, **state: Any) -> GatewayConfig:
    """Instance ``n``'s configuration (see :func:`instance_doc`)."""
    return GatewayConfig.model_validate(instance_doc(tmp, n, redis_url, secret, **state))


def instance(tmp: Path, n: int, redis_url: str, secret: Path, *, doc: dict[str, Any] | None = None,
             audit: AuditHub | None = None, **state: Any) -> Gateway:
    """Build (not start) instance ``n`` from a configuration file ``inst<n>/gateway.yaml`` (its registry
    reloads re-read it); ``doc``: that file's content (default :func:`instance_doc`)."""
    import yaml

    path = tmp / f"inst{n}" / "gateway.yaml"
    doc = doc or instance_doc(tmp, n, redis_url, secret, **state)
    path.write_text(yaml.safe_dump(doc))
    return build(load_config(path), audit=audit or AuditHub(None), config_path=str(path))


@contextlib.asynccontextmanager
async def shared_instances(tmp: Path, n: int, redis_url: str) -> AsyncIterator[list[Gateway]]:
    """``n`` instances with one master secret (``tmp/master.key``), their shared state started;
    stopped when the block ends."""
    secret = write_secret(tmp / "master.key")
    gws = [instance(tmp, i, redis_url, secret) for i in range(n)]
    try:
        for gw in gws:
            await gw.shared.start()
        yield gws
    finally:
        for gw in gws:
            await gw.shared.stop()
