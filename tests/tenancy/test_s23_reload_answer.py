"""S23-newcomer-5: a tenants reload names what it did not apply and logs start-up's tenant warnings.

``POST /admin/tenants/reload`` applies ``tenancy.tenants`` and ``tenancy.operators`` only. Before the fix
it answered 200 whatever else had changed in the file (a ``limits`` change silently not applied), and it
logged only the shared-pass and burst warnings, not the ``configuration:`` / ``limits:`` lines start-up
and ``config check`` print: a tenant added with a pool no replica is in and a model the gateway does not
serve was then served ``503 no_replica`` / ``404`` without a word in the log. Now the answer (the record)
has ``not_applied`` (setting names only) and ``warnings`` (the lines logged), and those lines are the ones
``config check`` prints for the same file (one function, gateway/tenant_warnings.py).
"""
from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

import yaml
from click.testing import CliRunner

from gateway.auditing import AuditHub
from gateway.build import build
from gateway.cli import main
from gateway.config import GatewayConfig, load_config
from sim.spiffe_issuer import DemoIssuer
from tenancy.admin import reload_tenants

ROOT = Path(__file__).resolve().parents[2]
TD = "demo.prefixgate.test"


def _tenant(tid: str, **extra) -> dict:
    return {"id": tid, "spiffe_ids": [f"spiffe://{TD}/{tid}/"], "models": ["sim-model"], "pools": ["default"],
            "rate_rps": 5, "rate_burst": 5, "prompt_tokens_per_s": 1000, "prompt_tokens_burst": 200_000, **extra}


def _config(tmp_path: Path, tenants: list[dict], **sections) -> dict:
    secret = tmp_path / "master.key"
    if not secret.exists():
        secret.write_text(secrets.token_hex(32))
        os.chmod(secret, 0o600)
        DemoIssuer(TD).write_bundle(tmp_path / "bundle.json")
    return {
        "listen": {"host": "127.0.0.1", "port": 0}, "admin": None,
        "replicas": [{"id": "r0", "url": "http://127.0.0.1:9", "pool": "default"}],
        "tenancy": {"master_secret_file": str(secret), "master_secret_env": None, "tenants": tenants,
                    "state_file": str(tmp_path / "keystate.json")},
        "identity": {"audience": "prefixgate", "trust_domains": {TD: {"bundle_file": str(tmp_path / "bundle.json")}}},
        "policy": {"mode": "embedded", "dir": str(ROOT / "rego")},
        **sections,
    }


def _write(path: Path, data: dict) -> None:
    path.write_text(yaml.safe_dump(GatewayConfig.model_validate(data).model_dump(mode="json", exclude_none=True)))


def _gateway(tmp_path: Path):
    cfg_file = tmp_path / "gateway.yaml"
    data = _config(tmp_path, [_tenant("acme")])
    _write(cfg_file, data)
    # the running configuration is the file's, as `serve --config` loads it
    return build(load_config(str(cfg_file)), audit=AuditHub(None), config_path=str(cfg_file)), cfg_file


async def test_reload_names_sections_not_applied_and_logs_startup_warnings(tmp_path: Path, caplog) -> None:
    gw, cfg_file = _gateway(tmp_path)
    hooli = _tenant("hooli", models=["sim-model", "gpt-9"], pools=["gpu"])
    del hooli["prompt_tokens_per_s"], hooli["prompt_tokens_burst"]
    _write(cfg_file, _config(tmp_path, [_tenant("acme"), hooli], limits={"max_messages": 3}))
    with caplog.at_level(logging.WARNING, logger="prefixgate"):
        record = await reload_tenants(gw.admin.reload_registry)
    assert record["tenant_ids"] == ["acme", "hooli"]  # the tenants are applied
    assert record["not_applied"] == ["limits"]  # the limits change is not, and the answer says so
    assert gw.admin.config.limits.max_messages != 3
    warnings = record["warnings"]
    assert "configuration: tenant hooli: model 'gpt-9' is not in `models` (requests for it answer 404)" in warnings
    assert "configuration: tenant hooli: no replica is in pool 'gpu'" in warnings
    assert any(w.startswith("limits: tenant hooli: no prompt_tokens_per_s") for w in warnings)
    assert not any("acme" in w for w in warnings)
    logged = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert all(w in logged for w in warnings)  # each logged as start-up logs it
    # the same lines `config check` prints for the file (the running config's limits are what the
    # reload reads them against; the file's limits change only the max_messages bound, not these lines)
    res = CliRunner().invoke(main, ["config", "check", "--config", str(cfg_file)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[:-1] == warnings


async def test_reload_of_tenants_only_has_nothing_not_applied(tmp_path: Path) -> None:
    gw, cfg_file = _gateway(tmp_path)
    _write(cfg_file, _config(tmp_path, [_tenant("acme"), _tenant("globex")]))
    record = await reload_tenants(gw.admin.reload_registry)
    assert record["tenant_ids"] == ["acme", "globex"] and record["not_applied"] == [] and record["warnings"] == []


async def test_reload_names_tenancy_fields_by_dotted_name(tmp_path: Path) -> None:
    gw, cfg_file = _gateway(tmp_path)
    data = _config(tmp_path, [_tenant("acme")])
    data["tenancy"]["usage_cached_tokens"] = "pass" if gw.config.tenancy.usage_cached_tokens != "pass" else "drop"
    data["replicas"].append({"id": "r1", "url": "http://127.0.0.1:10", "pool": "default"})
    _write(cfg_file, data)
    record = await reload_tenants(gw.admin.reload_registry)
    assert record["not_applied"] == ["replicas", "tenancy.usage_cached_tokens"]
    assert all(isinstance(name, str) and "http" not in name for name in record["not_applied"])  # names only
