"""Session 23, fixreg: the answers of an operator change that shared state refused to store.

S22-fixrot-1: two tenants reloads raced to one version (no master pending); the one stored second was answered
200 although the stored registry then replaced it here (``_publish_doc`` adopts it). A policy change answers 409
``conflict`` for that race since SF17-1; the reload now does too, audited as a failed reload. Before: 200.

S22-fixrot-2: with a master generation pending here, Redis failing between the refused publish and the read of the
stored record (``stored_unauthenticated``) made a policy change read ``unpublished`` (200) and a reload 200,
although the change was not stored and may be replaced. Now both fail closed: 503 ``state_unavailable``, audited.
Before: 200 for both.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import redis.exceptions
import yaml

from tests.scaleout.s2_instances import TD, shared_instances
from tests.scaleout.test_s22_fixrot_pending_change import TIERS, _admin, _audited, _pending_pair


def _fails_on_read(doc: Any) -> None:
    """``doc``'s read of the stored record after a refused publish raises, as a Redis that stops answering
    between the two commands (the publish's script ran; the next command fails)."""
    async def down() -> bool:
        raise redis.exceptions.ConnectionError("Redis went away")

    doc.stored_unauthenticated = down


async def test_racing_reloads_the_second_answers_409_conflict_and_adopts_the_stored_registry(
        tmp_path: Path, redis_server) -> None:
    async with shared_instances(tmp_path, 2, redis_server.url) as (a, b):
        path = tmp_path / "inst1" / "gateway.yaml"
        doc = yaml.safe_load(path.read_text())
        doc["tenancy"]["tenants"].append({"id": "tenant-b", "spiffe_ids": [f"spiffe://{TD}/tenant-b/"],
                                          "models": ["sim-model"], "pools": ["default"]})
        path.write_text(yaml.safe_dump(doc))  # b's reload brings another registry than a's
        read_version = b.shared.tenants.remote_version

        async def a_reloads_meanwhile() -> int:  # the race: a stores version 1 after b read the stored version
            version = await read_version()
            assert (await _admin(a, "POST", "/admin/tenants/reload")).status_code == 200
            return version

        b.shared.tenants.remote_version = a_reloads_meanwhile  # type: ignore[method-assign]
        seen = _audited(b)
        resp = await _admin(b, "POST", "/admin/tenants/reload")
        error = resp.json()["error"]
        assert resp.status_code == 409 and error["code"] == "conflict", resp.text  # was 200
        assert error["message"] == ("tenants version 1 was stored by another instance first; its registry "
                                    "is adopted here: retry the reload")
        assert [(r["action"], r.get("outcome", "succeeded")) for r in seen] == [
            ("tenants.reload", "succeeded"), ("tenants.reload", "failed")]  # applied, then replaced
        assert seen[-1]["status"] == 409 and seen[-1]["error_code"] == "conflict"
        # as answered: the stored registry (a's, without tenant-b) is in force on b
        assert b.admin.last_tenancy == a.admin.last_tenancy
        assert "tenant-b" not in [t["id"] for t in b.admin.last_tenancy["tenants"]]


async def test_a_policy_change_whose_check_meets_a_failing_redis_answers_503_state_unavailable(
        tmp_path: Path, redis_server) -> None:
    async with _pending_pair(tmp_path, redis_server.url) as (a, b, _, _):
        tiers = a.pdp.store.get_data(TIERS)
        tiers["gold"] = {"max_tokens": 7}
        assert (await a.pdp.store.put_data(TIERS, tiers, "spiffe://x/ops")).shared == "published"
        _fails_on_read(b.shared.policy)
        seen = _audited(b)
        mine = b.pdp.store.get_data(TIERS)
        mine["gold"] = {"max_tokens": 9}
        resp = await _admin(b, "PUT", f"/admin/data/{TIERS}", mine)
        error = resp.json()["error"]
        assert resp.status_code == 503 and error["code"] == "state_unavailable", resp.text  # was 200 unpublished
        assert "was not stored" in error["message"] and "shared state failed" in error["message"]
        assert error["result"]["shared"] == "unresolved" and error["result"]["version"] == 1
        assert [r.get("shared") for r in seen if r.get("outcome", "succeeded") == "succeeded"] == ["unresolved"]
        failed = [r for r in seen if r.get("outcome") == "failed"]
        assert len(failed) == 1 and failed[0]["status"] == 503 and failed[0]["error_code"] == "state_unavailable"


async def test_a_reload_whose_check_meets_a_failing_redis_answers_503_state_unavailable(
        tmp_path: Path, redis_server) -> None:
    async with _pending_pair(tmp_path, redis_server.url) as (a, b, _, _):
        assert (await _admin(a, "POST", "/admin/tenants/reload")).status_code == 200  # version 1, new master
        _fails_on_read(b.shared.tenants)
        seen = _audited(b)
        resp = await _admin(b, "POST", "/admin/tenants/reload")
        error = resp.json()["error"]
        assert resp.status_code == 503 and error["code"] == "state_unavailable", resp.text  # was 200
        assert "tenants version 1 is applied on this instance and was not stored" in error["message"]
        assert [(r["action"], r.get("outcome", "succeeded")) for r in seen] == [
            ("tenants.reload", "succeeded"), ("tenants.reload", "failed")]
        assert seen[-1]["status"] == 503 and seen[-1]["error_code"] == "state_unavailable"
