"""Session 30 (flake30, S30-flake30-1): a registry reload is not reverted by this instance's own shared-state
sync running while the reload publishes.

``POST /admin/tenants/reload`` applies the new tenants here, then publishes them: it first reads the stored
version from Redis (an ``await``). A sync of the tenants document that ran in that window (its poll, or the
channel message of this instance's previous publish, late on a loaded machine) compared the stored record at
this instance's version with the tenants in force *now*, the reload's: it took them for a second change made
at the same version elsewhere ("two changes made at once on two instances"), adopted the stored record,
so the reload's tenants were replaced by the previous ones, and the reload then published those under the new
version. The reload answered 200; every instance served the old tenants. Seen as CI's failure of
tests/security/test_s10_fixa_salt_reload.py at session 30's first run (the valid record never came).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml

from gateway.app import build_admin_app
from tests.scaleout.conftest import redis_server  # noqa: F401 - fixture
from tests.scaleout.s2_instances import ISSUER, OPERATOR, instance, instance_doc, write_secret

TD = "demo.prefixgate.test"


def _with(doc: dict[str, Any], tenant: str) -> dict[str, Any]:
    tenants = [*doc["tenancy"]["tenants"], {"id": tenant, "spiffe_ids": [f"spiffe://{TD}/{tenant}/"],
                                            "models": ["sim-model"], "pools": ["default"]}]
    return {**doc, "tenancy": {**doc["tenancy"], "tenants": tenants}}


def _admin(gw: Any) -> httpx.AsyncClient:
    token = ISSUER.mint(OPERATOR, "prefixgate-admin")
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=build_admin_app(gw)), base_url="http://admin",
                             headers={"Authorization": f"Bearer {token}"})


async def test_a_sync_inside_a_reloads_publish_keeps_the_reload(tmp_path: Path, redis_server: Any) -> None:  # noqa: F811
    secret = write_secret(tmp_path / "master.key")
    doc = instance_doc(tmp_path, 0, redis_server.url, secret)
    gw = instance(tmp_path, 0, redis_server.url, secret, doc=doc)
    path = tmp_path / "inst0" / "gateway.yaml"
    await gw.shared.start()
    try:
        tenants = gw.shared.tenants
        path.write_text(yaml.safe_dump(_with(doc, "tenant-b")))
        async with _admin(gw) as admin:
            assert (await admin.post("/admin/tenants/reload")).status_code == 200  # version 1: tenant-b
        assert gw.shared.registry_version == 1

        real = tenants.remote_version
        synced: list[bool] = []

        async def sync_first() -> int:  # the sync's poll lands in the reload's read of the stored version
            tenants._local_text = None  # as when this instance's sync has not run since its own publish
            synced.append(await tenants.sync())
            return await real()

        tenants.remote_version = sync_first  # type: ignore[method-assign]
        path.write_text(yaml.safe_dump(_with(_with(doc, "tenant-b"), "tenant-c")))
        async with _admin(gw) as admin:
            r = await admin.post("/admin/tenants/reload")
        assert r.status_code == 200, r.text
        assert synced == [False]  # the stored version 1 is this instance's own: nothing to adopt
        assert gw.registry.get("tenant-c") is not None  # before: None, version 1's tenants adopted again
        assert gw.shared.registry_version == 2
        stored = await real()
        assert stored == 2 and not await tenants.sync()  # what is stored at 2 is this reload's set
        assert gw.registry.get("tenant-c") is not None
    finally:
        await gw.shared.stop()
