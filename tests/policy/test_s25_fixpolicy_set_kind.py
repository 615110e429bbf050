"""Session 25, S25-newcomer-7: a whole-set version (a roll-back, or a set adopted from another instance) is
recorded with ``kind: "set"``, not ``kind: "policy"``.

Before: a roll-back that restored only data documents was recorded (``record.json``, the admin answer, the
audit event) as ``kind: "policy"``, ``target: "*"``: a SIEM filter on ``kind: policy`` took it for a module
change, and one on ``kind: data`` missed it. Now the three kinds are disjoint: ``policy`` (one module),
``data`` (one document), ``set`` (the whole set, ``target`` ``*``); a failed roll-back's audit record says
``set`` too. Versions recorded before keep ``policy`` and still restore (their ``target`` ``*`` decides).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.testclient import TestClient

from policy.admin import admin_routes
from policy.loader import load_policy_dir
from policy.store import ChangeRecord, PolicyStore

TIERS = "prefixgate/config/tiers"
OPS = "spiffe://prefixgate.test/ops/alice"


async def test_a_roll_back_and_an_adopted_set_are_kind_set(active: Path, tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    records: list[ChangeRecord] = []
    store = PolicyStore(active, versions, on_change=records.append)
    tiers = store.get_data(TIERS)
    tiers["standard"] = {**tiers["standard"], "max_tokens": 8}
    await store.put_data(TIERS, tiers, OPS)                           # version 1: a data change
    rec = await store.rollback(0, OPS)                                # version 2 undoes only that document
    assert (rec.kind, rec.target, rec.rollback_to) == ("set", "*", 0)
    assert json.loads((versions / "00000002" / "record.json").read_text())["kind"] == "set"
    assert [r.kind for r in records] == ["data", "set"]
    assert rec.audit_form()["kind"] == "set"

    other = tmp_path / "other"                                        # another instance's set, adopted
    shutil.copytree(active, other)
    other_store = PolicyStore(other, tmp_path / "other-versions")
    await other_store.put_data(TIERS, tiers, OPS)
    adopted = await store.adopt(3, load_policy_dir(other), "shared-state:b")
    assert adopted is not None and (adopted.kind, adopted.target) == ("set", "*")
    assert [e["kind"] for e in store.versions()[:3]] == ["set", "set", "data"]


async def test_a_version_recorded_as_kind_policy_before_still_restores(active: Path, tmp_path: Path) -> None:
    versions = tmp_path / "versions"
    store = PolicyStore(active, versions)
    tiers = store.get_data(TIERS)
    tiers["standard"] = {**tiers["standard"], "max_tokens": 8}
    await store.put_data(TIERS, tiers, OPS)
    await store.rollback(0, OPS)                                      # version 2, a whole set
    path = versions / "00000002" / "record.json"
    old_form = {**json.loads(path.read_text()), "kind": "policy"}     # as written before session 25
    path.write_text(json.dumps(old_form))
    await store.put_data(TIERS, tiers, OPS)                           # version 3
    rec = await store.rollback(2, OPS)
    assert (rec.version, rec.kind, rec.rollback_to) == (4, "set", 2)
    assert [r.kind for r in PolicyStore(active, versions).history()] == ["data", "policy", "data", "set"]


async def authorize(request: Request) -> dict[str, str]:
    return {"spiffe_id": OPS, "client_address": "10.0.0.9"}


def test_the_admin_answer_and_a_failed_roll_back_say_set(active: Path, tmp_path: Path) -> None:
    failures: list[dict[str, Any]] = []
    store = PolicyStore(active, tmp_path / "versions")
    app = Starlette(routes=admin_routes(store, authorize, on_failure=failures.append))
    with TestClient(app) as c:
        tiers = c.get(f"/admin/data/{TIERS}").json()["result"]
        tiers["standard"] = {**tiers["standard"], "max_tokens": 8}
        assert c.put(f"/admin/data/{TIERS}", json=tiers).json()["result"]["kind"] == "data"
        r = c.post("/admin/policies/rollback", json={"to": 0})
        assert r.status_code == 200 and r.json()["result"]["kind"] == "set"
        assert c.post("/admin/policies/rollback", json={"to": 9}).status_code == 400
    assert [(f["kind"], f["op"]) for f in failures] == [("set", "rollback")]
