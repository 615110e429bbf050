"""Session 20 review, S20-R1: an authentic but OLDER tenants record replayed into Redis is adopted by an
instance that (re)starts, rolling its registry back (a removed tenant and a revoked operator are back).

docs/scale-out.md ("Trust model": Redis cannot "forge, replay an older or roll back a policy set or tenant
table") holds for the policy set (``PolicyStore.version`` is persisted) and for key records (the state file),
but the registry's version is ``SharedState.registry_version``, an in-memory 0 at every start
(gateway/shared_state.py), and ``SharedDocument.sync`` adopts any authenticated record above the local
version. So whoever can write the ``docs:tenants`` key (the party the MAC guards against) can keep a copy of
an earlier record and put it back: a starting instance adopts it, and with one instance (or when every
instance restarts) nothing heals it: the instance's own version is then the replayed one.
"""
from __future__ import annotations

from pathlib import Path

import httpx
import redis.asyncio as aioredis
import yaml

from gateway.app import build_admin_app
from tests.scaleout.s2_instances import ISSUER, OPERATOR, PREFIX, TD, instance, instance_doc, write_secret
from tests.support.waiting import wait_for

REVOKED = f"spiffe://{TD}/ops/mallory"


def _admin(gw) -> httpx.AsyncClient:
    token = ISSUER.mint(OPERATOR, "prefixgate-admin")
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=build_admin_app(gw)), base_url="http://admin",
                             headers={"Authorization": f"Bearer {token}"})


async def _reload(gw) -> None:
    async with _admin(gw) as admin:
        resp = await admin.post("/admin/tenants/reload")
        assert resp.status_code == 200, resp.text


async def test_a_replayed_older_tenants_record_does_not_roll_a_restarted_instance_back(tmp_path: Path,
                                                                                        redis_server) -> None:
    secret = write_secret(tmp_path / "master.key")
    raw = aioredis.Redis.from_url(redis_server.url)
    try:
        # version 1: tenant-old and the operator mallory exist
        doc = instance_doc(tmp_path, 0, redis_server.url, secret)
        doc["tenancy"]["tenants"].append({"id": "tenant-old", "spiffe_ids": [f"spiffe://{TD}/old/"],
                                          "models": ["sim-model"], "pools": ["default"]})
        doc["tenancy"]["operators"].append(REVOKED)
        gw = instance(tmp_path, 0, redis_server.url, secret, doc=doc)
        await gw.shared.start()
        try:
            await _reload(gw)
            assert gw.shared.registry_version == 1
            v1 = await raw.get(f"{PREFIX}docs:tenants")
            # version 2: the operator removes tenant-old and revokes mallory (config file, then reload)
            doc["tenancy"]["tenants"] = [t for t in doc["tenancy"]["tenants"] if t["id"] != "tenant-old"]
            doc["tenancy"]["operators"] = [OPERATOR]
            (tmp_path / "inst0" / "gateway.yaml").write_text(yaml.safe_dump(doc))  # the file its reload reads
            await _reload(gw)
            assert gw.shared.registry_version == 2 and gw.registry.get("tenant-old") is None
            assert not gw.registry.is_operator(REVOKED)
        finally:
            await gw.shared.stop()
        # whoever writes Redis puts the authentic version-1 record back; the instance restarts
        await raw.set(f"{PREFIX}docs:tenants", v1)
        again = instance(tmp_path, 0, redis_server.url, secret, doc=doc)  # its file: version 2's content
        assert again.registry.get("tenant-old") is None
        await again.shared.start()
        try:
            async def settled() -> bool:  # the start's sync has read the record (adopted, or refused)
                return again.shared.tenants is not None and (again.shared.registry_version > 0
                                                             or again.shared.tenants.rejected > 0
                                                             or await raw.get(f"{PREFIX}docs:tenants") != v1)
            await wait_for(settled, what="the stored tenants record read")
            assert again.registry.get("tenant-old") is None, "a removed tenant is back (version 1 replayed)"
            assert not again.registry.is_operator(REVOKED), "a revoked operator is back (version 1 replayed)"
        finally:
            await again.shared.stop()
    finally:
        await raw.aclose()
