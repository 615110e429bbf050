"""Session 22, fixrot (S22-review-3): on an instance whose master is PENDING (a master rotation not provisioned
there yet), a policy/data change whose publish meets the rotated instances' higher record was answered 409
``conflict`` "its set is adopted here: retry the change". It is committed and applied here first, and nothing
can be adopted: ``SharedDocument.sync`` leaves a record it cannot authenticate while the master is pending
(S20-FS1), so the instance goes on deciding under the "refused" change. The tenants reload was alike (answered
200, logged "adopting the stored one").

Now (the lead's decision: keep the change in force here, tell the truth) such a change answers 503
``master_pending``, saying it is applied on this instance only and not shared and naming the master generation to
provision; the failure audit record carries that code. The ordinary conflict (no master pending) keeps its 409.
Before the fix: 409 ``conflict`` for the policy change, 200 for the reload.
"""
from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from gateway.app import build_admin_app
from gateway.build import Gateway
from tests.policy.conftest import make_input
from tests.scaleout.s2_instances import ISSUER, OPERATOR, instance, shared_instances
from tests.support.waiting import wait_for

TIERS = "prefixgate/config/tiers"
GOLD = make_input("tenant-z", entitlements={"tier": "gold", "models": ["sim-model"], "pools": ["default"]})


def _provision(path: Path, secret: str) -> None:
    path.write_text(secret)
    os.chmod(path, 0o600)


def _audited(gw: Gateway) -> list[dict[str, Any]]:
    """Every operator record ``gw`` audits from now on (successes and failures)."""
    seen: list[dict[str, Any]] = []
    record = gw.audit.record_operator

    def capture(rec: Any) -> None:
        seen.append(dict(rec))
        record(rec)

    gw.audit.record_operator = capture  # type: ignore[method-assign]
    return seen


async def _admin(gw: Gateway, method: str, path: str, body: Any = None) -> httpx.Response:
    token = ISSUER.mint(OPERATOR, "prefixgate-admin")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_admin_app(gw)), base_url="http://admin",
                                 headers={"Authorization": f"Bearer {token}"}) as admin:
        return await admin.request(method, path, json=body)


@contextlib.asynccontextmanager
async def _pending_pair(tmp_path: Path, redis_url: str) -> AsyncIterator[tuple[Gateway, Gateway, list[Path], str]]:
    """Instances a and b sharing one master; a rotated to generation 2, b's host not provisioned (pending)."""
    old, new = secrets.token_hex(32), secrets.token_hex(32)
    files = [tmp_path / f"master{i}.key" for i in range(2)]
    for f in files:
        _provision(f, old)
    a, b = (instance(tmp_path, i, redis_url, files[i]) for i in range(2))
    await a.shared.start()
    await b.shared.start()
    try:
        _provision(files[0], new)  # a's host only: b's is not provisioned yet
        assert (await _admin(a, "POST", "/admin/keys/rotate-master")).status_code == 200
        await wait_for(lambda: b.shared.keys.master_pending == 2, what="b reports the pending generation")
        yield a, b, files, new
    finally:
        await a.shared.stop()
        await b.shared.stop()


async def test_a_change_on_a_pending_instance_answers_503_master_pending_and_stays_in_force_here(
        tmp_path: Path, redis_server) -> None:
    async with _pending_pair(tmp_path, redis_server.url) as (a, b, files, new):
        tiers = a.pdp.store.get_data(TIERS)
        tiers["gold"] = {"max_tokens": 7}
        assert (await a.pdp.store.put_data(TIERS, tiers, OPERATOR)).shared == "published"  # under the new master
        seen = _audited(b)
        mine = b.pdp.store.get_data(TIERS)
        mine["gold"] = {"max_tokens": 9}  # the operator's change on b, at the version a stored first
        resp = await _admin(b, "PUT", f"/admin/data/{TIERS}", mine)
        error = resp.json()["error"]
        assert resp.status_code == 503 and error["code"] == "master_pending", resp.text  # was 409 conflict
        assert "applied on this instance only and not shared" in error["message"]
        assert "provision master generation 2" in error["message"] and "adopted here" not in error["message"]
        assert error["result"]["shared"] == "master_pending" and error["result"]["version"] == 1
        # audited: the committed change (it is in force here) and the failed request, with the code
        assert [r.get("shared") for r in seen if r.get("outcome", "succeeded") == "succeeded"] == ["master_pending"]
        failed = [r for r in seen if r.get("outcome") == "failed"]
        assert len(failed) == 1 and failed[0]["status"] == 503 and failed[0]["error_code"] == "master_pending"
        # as answered: b decides under its own change, and cannot adopt the stored set (S20-FS1)
        assert (await b.pdp.decide(GOLD)).max_tokens == 9
        assert await b.shared.policy.sync() is False and b.pdp.store.get_data(TIERS)["gold"] == {"max_tokens": 9}
        assert a.pdp.store.get_data(TIERS)["gold"] == {"max_tokens": 7}  # not shared
        # provisioned: b adopts the stored set (the change made on b alone is gone, as the answer said)
        _provision(files[1], new)
        await wait_for(lambda: b.keyring.master_generation == 2, what="b adopted the new master")
        await wait_for(lambda: b.pdp.store.get_data(TIERS)["gold"] == {"max_tokens": 7}, timeout_s=6.0,
                       what="b adopts the stored set")


async def test_a_reload_on_a_pending_instance_answers_503_master_pending(tmp_path: Path, redis_server) -> None:
    async with _pending_pair(tmp_path, redis_server.url) as (a, b, _, _):
        assert (await _admin(a, "POST", "/admin/tenants/reload")).status_code == 200  # tenants version 1, new master
        seen = _audited(b)
        resp = await _admin(b, "POST", "/admin/tenants/reload")
        error = resp.json()["error"]
        assert resp.status_code == 503 and error["code"] == "master_pending", resp.text  # was 200
        assert "tenants version 1 is applied on this instance only and not shared" in error["message"]
        assert "provision master generation 2" in error["message"]
        assert [(r["action"], r.get("outcome", "succeeded")) for r in seen] == [
            ("tenants.reload", "succeeded"), ("tenants.reload", "failed")]  # applied here, and not shared
        assert seen[-1]["status"] == 503 and seen[-1]["error_code"] == "master_pending"
        assert b.shared.registry_version == 1 and await b.shared.tenants.sync() is False


async def test_the_ordinary_conflict_keeps_its_409(tmp_path: Path, redis_server) -> None:
    async with shared_instances(tmp_path, 2, redis_server.url) as (a, b):
        await b.shared.policy.aclose()  # b does not follow a's change before its own is made
        tiers = a.pdp.store.get_data(TIERS)
        tiers["gold"] = {"max_tokens": 7}
        assert (await a.pdp.store.put_data(TIERS, tiers, OPERATOR)).shared == "published"
        seen = _audited(b)
        mine = b.pdp.store.get_data(TIERS)
        mine["gold"] = {"max_tokens": 9}
        resp = await _admin(b, "PUT", f"/admin/data/{TIERS}", mine)
        error = resp.json()["error"]
        assert resp.status_code == 409 and error["code"] == "conflict", resp.text
        assert error["message"].endswith("its set is adopted here: retry the change")
        assert error["result"]["shared"] == "conflict"
        assert [r.get("error_code") for r in seen if r.get("outcome") == "failed"] == ["conflict"]
        await b.shared.settle()  # the stored set is adopted, as answered
        assert b.pdp.store.get_data(TIERS)["gold"] == {"max_tokens": 7}
