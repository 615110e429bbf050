"""Session 25 (mend, S24-fixreg-3): the policy version history is bounded by ``policy.versions_keep``.

After each committed change (and at start) the oldest committed versions beyond the newest ``versions_keep``
are removed (``versions_dir/<N>/``), never the version in force; a roll-back to a pruned version answers 404
``version_pruned`` (a fixed message, recorded in the failure's audit record). Before: every version was kept
for ever (a disk that fills with each change).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.testclient import TestClient

import policy.store_versions as store_versions
from gateway.config_policy import PolicyConfig
from policy.admin import admin_routes
from policy.store import PolicyStore, PolicyVersionError

TIERS = "prefixgate/config/tiers"
OPS = "spiffe://prefixgate.test/ops/alice"


def _on_disk(versions: Path) -> list[int]:
    return sorted(int(p.name) for p in versions.iterdir() if p.name.isdigit())


async def _changes(store: PolicyStore, n: int) -> None:
    for i in range(n):
        tiers = store.get_data(TIERS)
        tiers["standard"] = {"max_tokens": 8 + i}
        await store.put_data(TIERS, tiers, OPS)


async def authorize(request: Request) -> dict[str, str]:
    return {"spiffe_id": OPS, "client_address": "10.0.0.9"}


async def test_the_oldest_versions_beyond_the_bound_are_pruned_never_the_one_in_force(active: Path,
                                                                                     tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    store = PolicyStore(active, versions, versions_keep=3)
    assert _on_disk(versions) == [0]
    await _changes(store, 5)
    assert store.version == 5 and _on_disk(versions) == [3, 4, 5]
    assert [e["version"] for e in store.versions(limit=10)] == [5, 4, 3]
    assert not [p for p in versions.iterdir() if not p.name.isdigit()]  # nothing left under a staged name

    with pytest.raises(PolicyVersionError) as err:
        await store.rollback(1, OPS)
    assert (err.value.status, err.value.code) == (404, "version_pruned") and "(3;" in str(err.value)
    rec = await store.rollback(3, OPS)  # a kept version still rolls back
    assert rec.version == 6 and _on_disk(versions) == [4, 5, 6]


async def test_keep_one_keeps_only_the_version_in_force_and_a_lower_bound_prunes_at_start(active: Path,
                                                                                         tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    store = PolicyStore(active, versions)  # the default, 100
    await _changes(store, 4)
    assert _on_disk(versions) == [0, 1, 2, 3, 4]
    restarted = PolicyStore(active, versions, versions_keep=1)
    assert restarted.version == 4 and _on_disk(versions) == [4]
    assert restarted.get_data(TIERS)["standard"] == {"max_tokens": 11}  # the set in force is untouched
    await _changes(restarted, 1)
    assert _on_disk(versions) == [5]


async def test_a_failed_prune_is_logged_and_the_change_stays_committed(active: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch,
                                                                       caplog: Any) -> None:
    versions = tmp_path / "versions"
    store = PolicyStore(active, versions, versions_keep=1)

    real_rename = store_versions.os.rename

    def refuse(src: Any, dst: Any) -> None:  # only the prune's rename (the os module is shared)
        if Path(src).parent == versions and Path(src).name.isdigit():
            raise PermissionError(13, "Permission denied")
        real_rename(src, dst)

    monkeypatch.setattr(store_versions.os, "rename", refuse)
    with caplog.at_level(logging.ERROR, logger="policy.store_versions"):
        rec = await store.put_policy("extra.rego", "package prefixgate.extra\n\nx := 1\n", OPS)
    assert rec.version == 1 and store.version == 1 and _on_disk(versions) == [0, 1]
    assert "version 0 could not be pruned (PermissionError)" in caplog.text
    monkeypatch.undo()
    await _changes(store, 1)  # the next commit prunes what the failed one left
    assert _on_disk(versions) == [2]


def test_the_admin_roll_back_to_a_pruned_version_answers_404_version_pruned(active: Path, tmp_path: Path) -> None:
    failures: list[dict[str, Any]] = []
    store = PolicyStore(active, tmp_path / "versions", versions_keep=2)
    app = Starlette(routes=admin_routes(store, authorize, on_failure=failures.append))
    with TestClient(app) as c:
        for i in range(3):
            r = c.put(f"/admin/policies/extra{i}.rego", content=f"package prefixgate.extra{i}\n\nx := 1\n",
                      headers={"content-type": "text/plain"})
            assert r.status_code == 200, r.text
        r = c.post("/admin/policies/rollback", json={"to": 0})
        assert (r.status_code, r.json()["error"]["code"]) == (404, "version_pruned")
        assert "older than the oldest version kept (2; policy.versions_keep)" in r.json()["error"]["message"]
        r = c.post("/admin/policies/rollback", json={"to": 2})
        assert r.status_code == 200, r.text
    assert failures[-1]["status"] == 404 and failures[-1]["error_code"] == "version_pruned"
    assert "policy.versions_keep" in failures[-1]["message"]


def test_the_bound_is_at_least_one_and_defaults_to_100() -> None:
    assert PolicyConfig().versions_keep == 100
    with pytest.raises(ValidationError, match="versions_keep"):
        PolicyConfig(versions_keep=0)
