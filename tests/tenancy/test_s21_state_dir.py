"""Session 21, S21-newcomer-2: a ``tenancy.state_file`` whose directory does not exist.

Before: ``config check`` said valid, ``serve`` started without a word (a shared key ring deferred its
lock to the first write) and every key or salt rotation answered 500 "cannot lock key state
...lock: No such file or directory". Now ``config check`` exits 1 and ``serve`` (``build``) refuses
to start, both naming the missing directory and what to create; a rotation whose directory went
away after the start says the same (500 ``key_ring_error``) and changes nothing."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gateway.build import build
from gateway.cli import main
from gateway.config import ConfigError, load_config
from sim.spiffe_issuer import DemoIssuer
from tenancy.keys import KeyRing, KeyRingError, KeyStateDirectoryMissing
from tests.conftest import TD, base_config

MASTER = b"m" * 48


def _config_file(tmp_path: Path, state_file: Path) -> Path:
    doc = base_config(tmp_path, ["http://127.0.0.1:9/r0"], DemoIssuer(TD))
    doc["tenancy"]["state_file"] = str(state_file)
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def _names_the_fix(text: str, directory: Path) -> None:
    assert f"the key-state directory {directory} does not exist" in text, text
    assert f"install -d -m 0700 -o <gateway user> {directory}" in text, text


def test_config_check_reports_the_missing_directory(tmp_path: Path) -> None:
    missing = tmp_path / "state"
    path = _config_file(tmp_path, missing / "keystate.json")
    res = CliRunner().invoke(main, ["config", "check", "--config", str(path)])
    assert res.exit_code == 1, res.output  # before: "valid", exit 0
    assert "tenancy.state_file: " in res.output
    _names_the_fix(res.output, missing)
    missing.mkdir()
    res = CliRunner().invoke(main, ["config", "check", "--config", str(path)])
    assert res.exit_code == 0, res.output


def test_serve_refuses_to_start(tmp_path: Path) -> None:
    missing = tmp_path / "state"
    cfg = load_config(_config_file(tmp_path, missing / "keystate.json"))
    with pytest.raises(ConfigError) as err:  # before: built, every rotation then a 500
        build(cfg)
    assert str(err.value).startswith("tenancy.state_file: ")
    _names_the_fix(str(err.value), missing)


@pytest.mark.parametrize("mode", ["shared", "exclusive"])
def test_the_key_ring_refuses_in_both_lock_modes(tmp_path: Path, mode: str) -> None:
    with pytest.raises(KeyStateDirectoryMissing) as err:
        KeyRing(MASTER, state_path=str(tmp_path / "nope" / "keystate.json"), state_lock=mode)
    _names_the_fix(str(err.value), tmp_path / "nope")


@pytest.mark.parametrize("change", ["rotate_tenant", "rotate_salt"])
def test_a_rotation_after_the_directory_went_says_the_same(tmp_path: Path, change: str) -> None:
    directory = tmp_path / "state"
    directory.mkdir()
    ring = KeyRing(MASTER, state_path=str(directory / "keystate.json"))
    before = (ring.current("acme").version, ring.salt_epoch("acme"))
    shutil.rmtree(directory)
    with pytest.raises(KeyRingError) as err:
        getattr(ring, change)("acme")
    _names_the_fix(str(err.value), directory)
    assert (ring.current("acme").version, ring.salt_epoch("acme")) == before
    ring.close()
