"""R5-9: PrefixGate installs seven generic top-level packages (audit, gateway, policy, rego,
routing, sim, tenancy). When another installed distribution also owns one of these import names
(PyPI has ``policy`` and ``routing``), the two overwrite each other's files; ``prefixgate serve``
refuses to start then, naming the package and the other distribution."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gateway.cli import main
from gateway.import_names import OUR_PACKAGES, collision_message, foreign_owners


def fake_distribution(root: Path, name: str, packages: list[str]) -> None:
    """A minimal installed distribution ``name`` (dist-info with METADATA, RECORD, top_level.txt)."""
    info = root / f"{name}-1.0.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0.0\n")
    (info / "top_level.txt").write_text("".join(p + "\n" for p in packages))
    (info / "RECORD").write_text("".join(f"{p}/__init__.py,,\n" for p in packages))


def test_our_packages_are_the_wheels_top_level() -> None:
    assert set(OUR_PACKAGES) == {"audit", "gateway", "policy", "rego", "routing", "sim", "tenancy"}


def test_this_environment_has_no_collision() -> None:
    assert foreign_owners() == {}
    assert collision_message() is None


def test_another_distribution_owning_policy_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_distribution(tmp_path, "policy", ["policy"])
    fake_distribution(tmp_path, "Routing_Lib", ["routing", "routing_extra"])
    fake_distribution(tmp_path, "unrelated", ["unrelated"])
    monkeypatch.syspath_prepend(str(tmp_path))
    assert foreign_owners() == {"policy": ["policy"], "routing": ["Routing_Lib"]}
    msg = collision_message()
    assert msg is not None
    assert "'policy' (also installed by policy)" in msg and "'routing' (also installed by Routing_Lib)" in msg
    assert "virtual environment" in msg


def test_serve_refuses_to_start_on_a_collision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_distribution(tmp_path / "site", "policy", ["policy"])
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    cfg = tmp_path / "gateway.yaml"
    cfg.write_text("{}\n")
    res = CliRunner().invoke(main, ["serve", "--config", str(cfg)])
    assert res.exit_code == 1
    assert "import name" in res.output and "'policy'" in res.output
