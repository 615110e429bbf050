"""Session 18 (S18-store-1): ``serve --workers N`` with ``policy.versions_dir`` is refused.

The workers of one host would share ``policy.dir`` and the version history; a change made through one
worker writes ``versions/N`` and every other worker's ``adopt(N)`` refuses it (the directory exists), so
they keep deciding on the old set. Until per-worker policy state exists, the combination does not start.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from click.testing import CliRunner

from gateway.cli import main, serving_refusal


def test_the_refusal_names_the_field_and_allows_one_worker() -> None:
    said = serving_refusal("redis", 2, policy_versions=True) or ""
    assert "policy.versions_dir" in said and "--workers 2" in said
    assert serving_refusal("redis", 1, policy_versions=True) is None
    assert serving_refusal("redis", 2, policy_versions=False) is None


def test_serve_refuses_before_starting_anything(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOGC", os.environ.get("GOGC", "800"))  # no re-exec inside the test process
    policy_dir = tmp_path / "policy"
    policy_dir.mkdir()
    cfg = {"state": {"backend": "redis", "url": "redis://127.0.0.1:1/0"},
           "policy": {"dir": str(policy_dir), "versions_dir": str(tmp_path / "versions")}}
    path = tmp_path / "gateway.yaml"
    path.write_text(json.dumps(cfg))
    result = CliRunner().invoke(main, ["serve", "--config", str(path), "--workers", "2"])
    assert result.exit_code != 0
    assert "policy.versions_dir" in result.output
    assert not (tmp_path / "versions").exists()
