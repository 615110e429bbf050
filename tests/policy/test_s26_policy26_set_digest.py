"""Session 26, policy26 (S25-review-7): a stored set edited on disk is not put back by a roll-back.

Before this fix the stored set of a single-key version (``versions/N/set.json``) was checked against its change
record's changed key only: a module or document of that file other than the changed one could be rewritten by
anyone who can write ``versions_dir``, and a roll-back to N put the rewritten set in force; at start a version
with no stored set (a history written before session 24) got the loaded set as its stored set when only N's
changed key agreed. Now every version's ``record.json`` carries ``set_sha256`` (the whole set's digest), checked
whenever the set is read (409 ``version_not_restorable``, logged, audited as a failed roll-back), the listing
says ``restorable: false`` for such a version, and at start the loaded set is stored for an old version only
when it equals the previous version's stored set in every other key.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from policy.admin import admin_routes
from policy.embedded import EmbeddedOpa
from policy.store import PolicyStore, PolicyVersionError
from policy.store_versions import keep_start_snapshot
from tests.support.policy_store import header_identity

TIERS = "prefixgate/config/tiers"
OPS = "spiffe://prefixgate.test/ops/alice"
EXTRA = "package prefixgate.extra\n\nx := 1\n"
#: a rule slipped into the stored copy of the shipped module (compiles, passes every Rego test)
SLIPPED = "\nslipped_in_on_disk := true\n"


def _tamper(versions: Path, version: int, edit: Any) -> None:
    path = versions / f"{version:08d}" / "set.json"
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc, sort_keys=True, separators=(",", ":")))


def _slip_into_authz(doc: dict[str, Any]) -> None:
    doc["modules"]["authz.rego"] += SLIPPED


async def test_a_roll_back_refuses_a_stored_set_whose_other_module_was_edited(
        active: Path, tmp_path: Path, mk: Any, caplog: pytest.LogCaptureFixture) -> None:
    versions = tmp_path / "versions"
    opa = EmbeddedOpa(active, timeout_s=5.0)
    store = PolicyStore(active, versions, target=opa)
    rec1 = await store.put_policy("extra.rego", EXTRA, OPS)              # version 1: changed key extra.rego
    tiers = store.get_data(TIERS)
    tiers["standard"] = {**tiers["standard"], "max_tokens": 8}
    await store.put_data(TIERS, tiers, OPS)                              # version 2
    stored = (versions / "00000001" / "set.json").read_bytes()
    record = json.loads((versions / "00000001" / "record.json").read_text())

    _tamper(versions, 1, _slip_into_authz)                               # extra.rego (the changed key) untouched
    with caplog.at_level(logging.ERROR, logger="policy.store_versions"), pytest.raises(PolicyVersionError) as exc:
        await store.rollback(1, OPS)
    assert (exc.value.status, exc.value.code) == (409, "version_not_restorable")
    assert "does not match its change record" in caplog.text and SLIPPED.strip() not in caplog.text
    assert store.version == 2 and not (versions / "00000003").exists()
    assert store.versions(limit=2)[1]["restorable"] is False
    assert "slipped_in_on_disk" not in store.get_policy("authz.rego") + (active / "authz.rego").read_text()
    assert (await opa.decide(mk("tenant-a"))).max_tokens == 8            # version 2 still decides

    _tamper(versions, 1, lambda doc: doc["data"].update({TIERS: {**doc["data"][TIERS], "standard": {}}}))
    with pytest.raises(PolicyVersionError):                             # a data document: refused too
        await store.rollback(1, OPS)
    rec0 = await store.rollback(0, OPS)                                  # an untouched version still restores
    assert (rec0.version, rec0.set_sha256) == (3, rec0.new_sha256)
    assert record.get("set_sha256") == hashlib.sha256(stored).hexdigest() == rec1.set_sha256  # what was checked


def test_the_admin_roll_back_to_an_edited_set_answers_409_and_is_audited(active: Path, tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    failures: list[dict[str, Any]] = []
    store = PolicyStore(active, versions)
    app = Starlette(routes=admin_routes(store, header_identity, on_failure=failures.append))
    h = {"x-test-spiffe-id": OPS}
    with TestClient(app) as c:
        assert c.put("/admin/policies/extra.rego", content=EXTRA, headers=h).status_code == 200
        assert c.put("/admin/policies/extra.rego", content=EXTRA + "y := 2\n", headers=h).status_code == 200
        _tamper(versions, 1, _slip_into_authz)
        r = c.post("/admin/policies/rollback", json={"to": 1}, headers=h)
        assert r.status_code == 409 and r.json()["error"]["code"] == "version_not_restorable", r.text
        listed = c.get("/admin/policies/versions", headers=h).json()
    assert listed["version"] == 2 and [e["restorable"] for e in listed["result"]] == [True, False, True]
    assert [(f["op"], f["status"], f["rollback_to"]) for f in failures] == [("rollback", 409, 1)]


async def test_the_start_stores_no_set_that_differs_from_the_previous_one_outside_the_changed_key(
        active: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    versions = tmp_path / "versions"
    store = PolicyStore(active, versions)
    await store.put_policy("extra.rego", EXTRA, OPS)                     # version 1 (stored set kept)
    await store.put_policy("extra.rego", EXTRA + "y := 2\n", OPS)        # version 2, made "old" below
    v2 = versions / "00000002"
    (v2 / "set.json").unlink()                                           # as written before session 24:
    old_record = json.loads((v2 / "record.json").read_text())            # no stored set, no set_sha256
    old_record.pop("set_sha256", None)
    (v2 / "record.json").write_text(json.dumps(old_record))
    loaded = store.policy_set                                            # the set after version 2

    edited = loaded.with_module("authz.rego", loaded.modules["authz.rego"] + SLIPPED)  # edited outside the API
    with caplog.at_level(logging.WARNING, logger="policy.store_versions"):
        assert keep_start_snapshot(versions, 2, edited) == "mismatch"
    assert "in a key other than version 2's change" in caplog.text and not (v2 / "set.json").exists()

    (active / "authz.rego").write_text(edited.modules["authz.rego"])     # the same, through a restart
    restarted = PolicyStore(active, versions)
    assert restarted.version == 2 and not (v2 / "set.json").exists()
    with pytest.raises(PolicyVersionError) as exc:
        await restarted.rollback(2, OPS)
    assert exc.value.code == "version_not_restorable"

    assert keep_start_snapshot(versions, 2, loaded) == "written"         # only the changed key differs: stored
    assert (await restarted.rollback(2, OPS)).version == 3               # and it puts the committed set back
    assert "slipped_in_on_disk" not in restarted.get_policy("authz.rego")


async def test_a_previous_stored_set_edited_on_disk_is_no_reference_at_start(active: Path, tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    store = PolicyStore(active, versions)
    await store.put_policy("extra.rego", EXTRA, OPS)
    await store.put_policy("extra.rego", EXTRA + "y := 2\n", OPS)
    v2 = versions / "00000002"
    (v2 / "set.json").unlink()
    old_record = json.loads((v2 / "record.json").read_text())
    old_record.pop("set_sha256", None)
    (v2 / "record.json").write_text(json.dumps(old_record))
    _tamper(versions, 1, _slip_into_authz)                               # the reference itself was edited
    edited = store.policy_set.with_module("authz.rego", store.policy_set.modules["authz.rego"] + SLIPPED)
    assert keep_start_snapshot(versions, 2, edited) == "mismatch"        # fail closed
    assert keep_start_snapshot(versions, 2, store.policy_set) == "mismatch"
