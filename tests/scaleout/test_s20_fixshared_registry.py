"""Session 20, fixshared (S20-R1): the registry's highest version seen is persisted in the key-state file
(``registry_version``) by the instances that adopt or publish it, so a restarted instance still adopts
the shared table at that version (its registry is its own file's until then), refuses a lower record
(counted ``{kind="tenants",reason="lower"}``), and numbers its next reload above what it has seen."""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import redis.asyncio as aioredis

from gateway.app import build_admin_app
from tests.scaleout.s2_instances import ISSUER, OPERATOR, PREFIX, TD, instance, instance_doc, write_secret
from tests.support.waiting import wait_for


async def _reload(gw) -> None:
    token = ISSUER.mint(OPERATOR, "prefixgate-admin")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_admin_app(gw)), base_url="http://admin",
                                 headers={"Authorization": f"Bearer {token}"}) as admin:
        resp = await admin.post("/admin/tenants/reload")
        assert resp.status_code == 200, resp.text


def _persisted(tmp: Path, n: int) -> int:
    return json.loads((tmp / f"inst{n}" / "keystate.json").read_text())["registry_version"]


def _rejected(gw, reason: str) -> float:
    return gw.metrics.admin.get_sample_value("prefixgate_shared_state_rejected_records_total",
                                             {"kind": "tenants", "reason": reason}) or 0.0


async def test_a_restarted_instance_adopts_the_shared_table_at_its_persisted_version(tmp_path: Path,
                                                                                     redis_server) -> None:
    secret = write_secret(tmp_path / "master.key")
    doc_a = instance_doc(tmp_path, 0, redis_server.url, secret)
    doc_a["tenancy"]["tenants"].append({"id": "tenant-new", "spiffe_ids": [f"spiffe://{TD}/new/"],
                                        "models": ["sim-model"], "pools": ["default"]})
    a = instance(tmp_path, 0, redis_server.url, secret, doc=doc_a)
    b = instance(tmp_path, 1, redis_server.url, secret)  # its file: without tenant-new
    await a.shared.start()
    await b.shared.start()
    try:
        await _reload(a)
        await wait_for(lambda: b.registry.get("tenant-new") is not None, what="b adopted version 1")
        assert _persisted(tmp_path, 0) == 1 and _persisted(tmp_path, 1) == 1  # adopter and publisher
    finally:
        await b.shared.stop()
    again = instance(tmp_path, 1, redis_server.url, secret)  # restarted: its file still lacks tenant-new
    assert again.registry.get("tenant-new") is None and again.keyring.registry_version == 1
    await again.shared.start()
    try:
        # version 1 is the highest it has seen, not a lower one: adopted (no rejection)
        assert again.registry.get("tenant-new") is not None and again.shared.registry_version == 1
        assert _rejected(again, "lower") == 0
    finally:
        await again.shared.stop()
        await a.shared.stop()


async def test_after_a_refused_replay_the_next_reload_is_numbered_above_the_persisted_version(
        tmp_path: Path, redis_server) -> None:
    secret = write_secret(tmp_path / "master.key")
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        gw = instance(tmp_path, 0, redis_server.url, secret)
        await gw.shared.start()
        try:
            await _reload(gw)
            v1 = await raw.get(f"{PREFIX}docs:tenants")
            await _reload(gw)
            await _reload(gw)
            assert gw.shared.registry_version == 3 and _persisted(tmp_path, 0) == 3
        finally:
            await gw.shared.stop()
        await raw.set(f"{PREFIX}docs:tenants", v1)  # an authentic, older record put back
        again = instance(tmp_path, 0, redis_server.url, secret)
        await again.shared.start()
        try:
            await wait_for(lambda: _rejected(again, "lower") == 1, what="the replayed record refused and counted")
            assert again.shared.registry_version == 0  # it serves its file's registry, version 1 not adopted
            await _reload(again)
            assert again.shared.registry_version == 4 and _persisted(tmp_path, 0) == 4
            assert (await raw.get(f"{PREFIX}docs:tenants")).startswith(b"4:")
        finally:
            await again.shared.stop()
    finally:
        await raw.aclose()
