"""Session 25, S25-newcomer-8: after the policy directory is edited by hand and the gateway restarted, a
roll-back to the version in force puts its committed set back, and the versions listing shows the drift.

The start's WARNING and docs/policy.md say "a roll-back to version N puts the committed set back"; before
this fix ``POST /admin/policies/rollback {"to": N}`` answered 400 (N is the version in force) while the
gateway decided under the edited set and ``GET /admin/policies/versions`` listed N as in force, with no
sign of the edit. Now ``to`` = N is allowed while the active set differs from N's stored set (committed as
N+1 through the same gate, journal, target and audit as any roll-back), refused (400) when it does not, and
the listing carries ``active_set_sha256``, ``in_force_set_sha256`` and ``drift``.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from policy.admin import admin_routes
from policy.embedded import EmbeddedOpa
from policy.store import ChangeRecord, PolicyStore, PolicyUnchanged, PolicyVersionError
from tests.support.policy_store import header_identity

TIERS = "prefixgate/config/tiers"
OPS = "spiffe://prefixgate.test/ops/alice"


def _edit_tiers_by_hand(active: Path, max_tokens: int) -> None:
    path = active / "data" / f"{TIERS}.json"
    doc = json.loads(path.read_text())
    doc["standard"] = {**doc["standard"], "max_tokens": max_tokens}
    path.write_text(json.dumps(doc))


async def test_a_roll_back_to_the_version_in_force_undoes_a_hand_edit(
        active: Path, tmp_path: Path, mk: Any, caplog: pytest.LogCaptureFixture) -> None:
    versions = tmp_path / "versions"
    store = PolicyStore(active, versions)
    tiers = store.get_data(TIERS)
    tiers["standard"] = {**tiers["standard"], "max_tokens": 64}
    await store.put_data(TIERS, tiers, OPS)                           # version 1: 64 tokens
    committed = store.list_data()
    assert store.drift()["drift"] is False

    _edit_tiers_by_hand(active, 8)                                    # outside the admin API, then a restart
    opa = EmbeddedOpa(active, timeout_s=5.0)
    records: list[ChangeRecord] = []
    with caplog.at_level(logging.WARNING, logger="policy.store_versions"):
        restarted = PolicyStore(active, versions, target=opa, on_change=records.append)
    assert "a roll-back to version 1 puts the committed set back" in caplog.text
    assert (await opa.decide(mk("tenant-a"))).max_tokens == 8         # the edited set decides
    drift = restarted.drift()
    assert restarted.version == 1 and drift["drift"] is True
    assert drift["in_force_set_sha256"] == restarted.versions(limit=1)[0]["set_sha256"]
    assert drift["active_set_sha256"] != drift["in_force_set_sha256"]

    rec = await restarted.rollback(1, OPS)                            # the documented remedy
    assert (rec.version, rec.rollback_to, rec.target) == (2, 1, "*")
    assert (rec.old_sha256, rec.new_sha256) == (drift["active_set_sha256"], drift["in_force_set_sha256"])
    assert records == [rec] and restarted.list_data() == committed
    assert (await opa.decide(mk("tenant-a"))).max_tokens == 64
    assert restarted.drift() == {"active_set_sha256": drift["in_force_set_sha256"],
                                 "in_force_set_sha256": drift["in_force_set_sha256"], "drift": False}
    assert PolicyStore(active, versions).list_data() == committed     # on disk too

    again = await restarted.rollback(2, OPS)                          # no drift now: nothing to put back
    assert isinstance(again, PolicyUnchanged) and again.version == 2  # session 26: 200 unchanged (was 400)
    assert restarted.version == 2 and records == [rec]


async def test_the_version_in_force_without_drift_changes_nothing_and_a_later_one_is_refused(
        active: Path, tmp_path: Path) -> None:
    store = PolicyStore(active, tmp_path / "versions")
    same = await store.rollback(0, OPS)                               # version 0 is in force: no drift
    assert isinstance(same, PolicyUnchanged) and same.entry["start"] is True  # session 26 (was 400)
    with pytest.raises(PolicyVersionError) as exc:
        await store.rollback(1, OPS)
    assert (exc.value.status, exc.value.code) == (400, "invalid_parameter")
    assert store.version == 0 and not (tmp_path / "versions" / "00000001").exists()


def test_the_versions_listing_shows_the_drift_and_the_route_rolls_it_back(active: Path, tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    PolicyStore(active, versions)                                     # version 0 stored at the first start
    _edit_tiers_by_hand(active, 8)
    store = PolicyStore(active, versions)
    app = Starlette(routes=admin_routes(store, header_identity))
    h = {"x-test-spiffe-id": OPS}
    with TestClient(app) as c:
        listed = c.get("/admin/policies/versions", headers=h).json()
        assert listed["version"] == 0 and listed["drift"] is True
        assert listed["in_force_set_sha256"] == listed["result"][0]["set_sha256"] != listed["active_set_sha256"]
        r = c.post("/admin/policies/rollback", json={"to": 0}, headers=h)
        assert r.status_code == 200, r.text
        assert (r.json()["result"]["version"], r.json()["result"]["rollback_to"]) == (1, 0)
        listed = c.get("/admin/policies/versions", headers=h).json()
        assert listed["version"] == 1 and listed["drift"] is False
        assert listed["active_set_sha256"] == listed["result"][0]["set_sha256"] == listed["result"][1]["set_sha256"]
        r = c.post("/admin/policies/rollback", json={"to": 1}, headers=h)  # no drift: nothing to put back
        assert (r.status_code, r.json()["unchanged"], r.json()["result"]["version"]) == (200, True, 1)  # session 26
