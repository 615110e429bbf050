"""Session 30 (S30-lead-1): a registry reload is not lost to a sync that runs between its apply and its publish.

``POST /admin/tenants/reload`` applies the new registry (in a worker thread), then the shared-state hook takes
the next version and publishes it. Before, a sync of the tenants document in that window (its poll or a channel
message: found as a CI flake of tests/security/test_s10_fixa_salt_reload.py under load) compared the stored
record at this instance's version with the *live* registry, which the reload had just changed, called it a
conflict of two instances (S17-1) and adopted the stored record back; the hook then published that old registry
under the new version. The reload answered 200 and the change was lost on every instance (an operator removing a
tenant saw it removed, and it was served again). Now the body compared is the one this instance published or
adopted at that version. The window is opened deterministically here: a change hook placed before the shared
state's runs the sync.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.app import build_admin_app
from tests.scaleout.conftest import redis_server  # noqa: F401 - fixture
from tests.scaleout.s2_instances import ISSUER, OPERATOR, TD, instance, instance_doc, write_secret
from tests.support.waiting import wait_for


def _with_tenant(doc: dict[str, Any], tenant_id: str | None) -> dict[str, Any]:
    tenants = [t for t in doc["tenancy"]["tenants"] if t["id"] == "tenant-a"]
    if tenant_id is not None:
        tenants.append({"id": tenant_id, "spiffe_ids": [f"spiffe://{TD}/{tenant_id}/"], "models": ["sim-model"],
                        "pools": ["default"]})
    return {**doc, "tenancy": {**doc["tenancy"], "tenants": tenants}}


async def _reload(gw: Any) -> int:
    token = ISSUER.mint(OPERATOR, "prefixgate-admin")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=build_admin_app(gw)), base_url="http://admin",
                                 headers={"Authorization": f"Bearer {token}"}) as admin:
        return (await admin.post("/admin/tenants/reload")).status_code


@pytest.mark.parametrize("second", [0, 1], ids=["published-here", "adopted-here"])
async def test_a_sync_between_a_reloads_apply_and_its_publish_does_not_revert_it(tmp_path: Path, redis_server: Any,  # noqa: F811
                                                                                 second: int) -> None:
    """Instance 0 reloads version 1; instance ``second`` (0: the one that published version 1, 1: the one that
    adopted it, S30-lead-2) reloads version 2 with a sync of its own in the window."""
    secret = write_secret(tmp_path / "master.key")
    docs = [instance_doc(tmp_path, n, redis_server.url, secret) for n in (0, 1)]
    gws = [instance(tmp_path, n, redis_server.url, secret, doc=docs[n]) for n in (0, 1)]
    first, other = gws[0], gws[1 - second]
    try:
        for gw in gws:
            await gw.shared.start()
        a, b = gws[second], other
        await a.shared.tenants.aclose()  # its follower stopped: its syncs are the ones this test makes
        (tmp_path / "inst0" / "gateway.yaml").write_text(yaml.safe_dump(_with_tenant(docs[0], "tenant-b")))
        assert await _reload(first) == 200  # version 1: tenant-a, tenant-b
        assert first.shared.registry_version == 1
        if second:
            assert await a.shared.tenants.sync()  # instance 1 adopts version 1 (and compares nothing yet)
        await wait_for(lambda: gws[1].registry.get("tenant-b") is not None, what="version 1 adopted by instance 1")

        synced: list[bool] = []

        async def sync_in_the_window(record: dict[str, Any]) -> None:
            if record.get("action") == "tenants.reload":
                synced.append(await a.shared.tenants.sync())

        a.admin.change_hooks.insert(0, sync_in_the_window)
        path = tmp_path / f"inst{second}" / "gateway.yaml"
        path.write_text(yaml.safe_dump(_with_tenant(docs[second], None)))  # tenant-b removed
        assert await _reload(a) == 200
        assert synced == [False]  # before: True, the stored version 1 adopted back as a "conflict"
        assert a.registry.get("tenant-b") is None and a.shared.registry_version == 2
        assert await a.shared.tenants.holds(2, a.admin.last_tenancy)
        assert [t["id"] for t in a.admin.last_tenancy["tenants"]] == ["tenant-a"]
        await wait_for(lambda: b.registry.get("tenant-b") is None, what="the removal adopted by the other instance")
        assert b.shared.registry_version == 2
    finally:
        for gw in gws:
            await gw.shared.stop()
