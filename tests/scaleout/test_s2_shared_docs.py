"""Key rotations, policy changes and registry reloads through one instance's admin API reach the
others through Redis (gateway/shared_state.py, gateway/shared_docs.py; issue 16)."""
from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
import yaml
from prometheus_client import generate_latest

from gateway.app import build_admin_app
from tests.policy.conftest import make_input
from tests.scaleout.s2_instances import (
    ISSUER,
    OPERATOR,
    PREFIX,
    instance_doc,
    shared_instances,
)
from tests.support.waiting import wait_for

TIERS = "prefixgate/config/tiers"


@pytest.fixture
async def trio(tmp_path: Path, redis_server):
    async with shared_instances(tmp_path, 3, redis_server.url) as gws:
        yield gws


def _admin(gw) -> httpx.AsyncClient:
    token = ISSUER.mint(OPERATOR, "prefixgate-admin")
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=build_admin_app(gw)), base_url="http://admin",
                             headers={"Authorization": f"Bearer {token}"})


async def test_a_rotation_through_the_admin_api_reaches_the_other_instances(trio, redis_server) -> None:
    a, b, c = trio
    assert len({gw.keyring.cache_salt("tenant-a") for gw in trio}) == 1
    raw = aioredis.Redis.from_url(redis_server.url)
    async with _admin(a) as admin:
        assert (await admin.post("/admin/tenants/tenant-a/rotate-key")).status_code == 200
        # published by the admin call itself (not left to the next poll)
        assert (await raw.hget(f"{PREFIX}keys:tenants", "tenant-a")).startswith(b"2:0:")
        assert (await admin.post("/admin/tenants/tenant-a/rotate-salt")).status_code == 200
        # shared by then (test_s3_master_generation.py); here the file still holds the same secret
        assert (await admin.post("/admin/keys/rotate-master")).status_code == 409
    await raw.aclose()
    for gw in (b, c):  # Pub/Sub carries it; the 1 s poll is the fallback
        await wait_for(lambda gw=gw: (gw.keyring.key_version("tenant-a"), gw.keyring.salt_epoch("tenant-a")) == (2, 1),
                       what="rotation adopted")
    assert len({gw.keyring.cache_salt("tenant-a") for gw in trio}) == 1
    assert len({gw.keyring.current("tenant-a").kid for gw in trio}) == 1


async def test_a_policy_change_reaches_every_instance_and_clears_its_decision_cache(trio) -> None:
    a, b, c = trio
    gold = {"tier": "gold", "models": ["sim-model"], "pools": ["default"]}
    doc = make_input("tenant-z", entitlements=gold)
    before = await b.pdp.decide(doc)
    assert (await b.pdp.decide(doc)).cached  # b now holds a decision made under the old policy
    tiers = a.pdp.store.get_data(TIERS)
    tiers["gold"] = {"max_tokens": 2048}
    async with _admin(a) as admin:
        resp = await admin.put(f"/admin/data/{TIERS}", content=json.dumps(tiers),
                               headers={"Content-Type": "application/json"})
        assert resp.status_code == 200, resp.text
    await a.shared.settle()
    for gw in (b, c):
        await wait_for(lambda gw=gw: gw.pdp.store.version == 1, what="policy version 1 adopted")
    after = await b.pdp.decide(doc)
    assert not after.cached and after.max_tokens == 2048 and (before.max_tokens != 2048 or not before.allow)
    # adopted sets are persisted like local ones: a restart keeps version 1
    from policy.store import PolicyStore

    again = PolicyStore(c.config.policy.resolved_dir(), c.config.policy.versions_dir)
    assert again.version == 1 and again.get_data(TIERS)["gold"] == {"max_tokens": 2048}


async def test_a_registry_reload_reaches_every_instance_and_clears_its_decision_cache(trio, tmp_path: Path,
                                                                                     redis_server) -> None:
    a, b, _ = trio
    doc = instance_doc(tmp_path, 0, redis_server.url, tmp_path / "master.key")
    doc["tenancy"]["tenants"].append({"id": "tenant-new", "spiffe_ids": ["spiffe://demo.prefixgate.test/new/"],
                                      "models": ["sim-model"], "pools": ["default"]})
    (tmp_path / "inst0" / "gateway.yaml").write_text(yaml.safe_dump(doc))
    clears = b.pdp.dp.cache.clears
    async with _admin(a) as admin:
        assert (await admin.post("/admin/tenants/reload")).status_code == 200
    await wait_for(lambda: b.registry.get("tenant-new") is not None, what="registry reload adopted")
    assert b.pdp.dp.cache.clears > clears and b.shared.registry_version == 1


async def test_forged_or_lower_records_are_ignored_counted_and_alerted(trio, redis_server, caplog) -> None:
    a, b, _ = trio
    raw = aioredis.Redis.from_url(redis_server.url)
    caplog.set_level(logging.WARNING, logger="prefixgate.state")
    try:
        # forged: a high version without the MAC (Redis is trusted for counters only)
        body = json.dumps({"modules": {"evil.rego": "package x\n"}, "data": {}})
        await raw.set(f"{PREFIX}docs:policy", f"99:{'00' * 32}:{body}")
        await raw.publish(f"{PREFIX}docs:changed", "policy")
        await wait_for(lambda: b.shared.policy.rejected >= 1, what="forged policy rejected")
        assert b.pdp.store.version == 0 and "evil.rego" not in b.pdp.store.policy_set.modules
        assert "ignored a policy record (unauthenticated)" in caplog.text
        assert b'prefixgate_shared_state_rejected_records_total{kind="policy",reason="unauthenticated"}' \
            in generate_latest(b.metrics.admin)
        # a real change replaces the forged record (tampering cannot block a change)
        tiers = a.pdp.store.get_data(TIERS)
        for n in (1, 2):
            tiers[f"t{n}"] = {"max_tokens": 100 + n}
            await a.pdp.store.put_data(TIERS, tiers, OPERATOR)
            await a.shared.settle()
            if n == 1:
                await wait_for(lambda: b.pdp.store.version == 1, what="v1 adopted")
                v1 = await raw.get(f"{PREFIX}docs:policy")
        await wait_for(lambda: b.pdp.store.version == 2, what="v2 adopted")
        # lower: an authentic but older record replayed into Redis is ignored, counted, and healed
        before = sum(gw.shared.policy.rejected for gw in trio)
        await raw.set(f"{PREFIX}docs:policy", v1)
        await raw.publish(f"{PREFIX}docs:changed", "policy")
        # whichever instance reads it first counts it and heals it (the others may then read v2)
        await wait_for(lambda: sum(gw.shared.policy.rejected for gw in trio) > before, what="lower policy rejected")
        assert b.pdp.store.version == 2 and "t2" in b.pdp.store.get_data(TIERS)
        assert "ignored a policy record (lower)" in caplog.text
        async def healed() -> bool:
            return await b.shared.policy.remote_version() == 2

        await wait_for(healed, what="v2 re-published over the replayed v1")
        # an emptied Redis rolls nothing back either
        await raw.flushall()
        await wait_for(healed, what="v2 re-published after a flush")
        assert b.pdp.store.version == 2
    finally:
        await raw.aclose()
