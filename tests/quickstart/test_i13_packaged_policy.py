"""Issue 13: the policy ships with the package and is found without the working directory.

(The wheel itself is built, installed and served from an unrelated directory
in test_i13_quickstart.py.)
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from gateway.cli import main as prefixgate
from gateway.config import ConfigError, load_config
from rego import policy_dir


def test_default_policy_dir_is_the_package_not_the_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # no ./rego here
    cfg = load_config(None)
    assert cfg.policy.dir is None
    assert Path(cfg.policy.resolved_dir()) == policy_dir()
    assert (policy_dir() / "authz.rego").is_file() and policy_dir().is_absolute()
    assert not (policy_dir() / "data" / "prefixgate" / "config" / "tenants.json").exists()


def test_policy_management_needs_an_explicit_directory(tmp_path: Path) -> None:
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text(yaml.safe_dump({"policy": {"versions_dir": str(tmp_path / "v")}}))
    with pytest.raises(ConfigError, match=r"policy: versions_dir needs an explicit dir"):
        load_config(cfg)


def test_policy_export_and_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOGC", os.environ.get("GOGC", "800"))
    target = tmp_path / "mypolicy"
    res = CliRunner().invoke(prefixgate, ["policy", "export", str(target)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in target.iterdir()) == ["authz.rego", "authz_test.rego", "data"]
    assert (target / "authz.rego").read_text() == (policy_dir() / "authz.rego").read_text()
    again = CliRunner().invoke(prefixgate, ["policy", "export", str(target)])
    assert again.exit_code != 0 and "exists" in again.output
    for args in (["policy", "test"], ["policy", "test", str(target)]):
        ran = CliRunner().invoke(prefixgate, args)
        assert ran.exit_code == 0 and " 0 failed" in ran.output, ran.output
