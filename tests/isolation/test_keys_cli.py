"""``prefixgate keys`` (tenancy.cli.keys_group) against a config file, a state file and a master file."""

from __future__ import annotations

import json
import os
import secrets
import stat
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tenancy.cli import keys_group
from tenancy.keys import KeyRing, load_master_secret


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    master = tmp_path / "master.key"
    master.write_bytes(secrets.token_hex(32).encode())
    os.chmod(master, 0o600)
    doc = {
        "listen": {"port": 0},
        "tenancy": {
            "master_secret_file": str(master),
            "state_file": str(tmp_path / "keystate.json"),
            "tenants": [
                {"id": "acme", "spiffe_ids": ["spiffe://td.example/acme/"], "models": ["m"], "pools": ["p"]},
                {"id": "bravo", "spiffe_ids": ["spiffe://td.example/bravo/"], "models": ["m"], "pools": ["p"]},
            ],
        },
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run(*args: str) -> tuple[int, dict]:
    res = CliRunner().invoke(keys_group, list(args))
    out = res.output.strip().splitlines()
    return res.exit_code, (json.loads(out[-1]) if res.exit_code == 0 else {"output": res.output})


def test_show_and_rotate_tenant_and_salt(cfg: Path, tmp_path: Path) -> None:
    master = (tmp_path / "master.key").read_bytes()
    code, shown = run("show", "--config", str(cfg))
    assert code == 0
    assert [(t["tenant_id"], t["key_version"], t["salt_epoch"]) for t in shown["tenants"]] == [
        ("acme", 1, 0), ("bravo", 1, 0)]
    code, rec = run("rotate-tenant", "--config", str(cfg), "acme")
    assert code == 0 and rec["action"] == "tenant.rotate_key" and rec["key_version"] == 2
    code, rec = run("rotate-salt", "--config", str(cfg), "bravo")
    assert code == 0 and rec["salt_epoch"] == 1
    # a gateway starting on this state file sees the new versions; kids match what the CLI printed
    ring = KeyRing(master, state_path=str(tmp_path / "keystate.json"))
    assert ring.key_version("acme") == 2 and ring.salt_epoch("bravo") == 1 and ring.key_version("bravo") == 1
    code, shown = run("show", "--config", str(cfg))
    assert shown["tenants"][0]["kid"] == ring.current("acme").kid == rec_kid(cfg, "acme")
    # no key material in any output
    everything = json.dumps(shown) + json.dumps(rec)
    assert master.hex() not in everything and ring.current("acme").key.hex() not in everything
    assert ring.cache_salt("bravo") not in everything


def rec_kid(cfg: Path, tenant: str) -> str:
    _, shown = run("show", "--config", str(cfg))
    return next(t["kid"] for t in shown["tenants"] if t["tenant_id"] == tenant)


def test_unknown_tenant_and_missing_state_file(cfg: Path, tmp_path: Path) -> None:
    code, out = run("rotate-tenant", "--config", str(cfg), "nobody")
    assert code == 2 and "no tenant" in out["output"]
    doc = yaml.safe_load(cfg.read_text())
    del doc["tenancy"]["state_file"]
    cfg.write_text(yaml.safe_dump(doc))
    code, out = run("rotate-salt", "--config", str(cfg), "acme")
    assert code == 2 and "state_file" in out["output"]


def test_rotate_master_writes_a_new_private_secret(cfg: Path, tmp_path: Path) -> None:
    path = tmp_path / "master.key"
    old = path.read_bytes()
    old_kid = KeyRing(old).current("acme").kid
    code, rec = run("rotate-master", "--config", str(cfg))
    assert code == 0 and rec["action"] == "keys.rotate_master"
    new = load_master_secret(str(path), None)  # refuses group/world-readable files
    assert new != old and len(new) == 64  # 32 random bytes, hex-encoded
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert old.hex() not in json.dumps(rec) and new.hex() not in json.dumps(rec)
    assert KeyRing(new).current("acme").kid != old_kid
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".master.key.")]  # no temp file left


def test_rotate_master_refuses_env_master(cfg: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = yaml.safe_load(cfg.read_text())
    doc["tenancy"]["master_secret_file"] = None
    doc["tenancy"]["master_secret_env"] = "PG_TEST_MASTER"
    cfg.write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("PG_TEST_MASTER", "x" * 40)
    code, out = run("rotate-master", "--config", str(cfg))
    assert code == 2 and "environment" in out["output"]
    assert run("show", "--config", str(cfg))[0] == 0  # env master works for reading
