"""Session 10 review, R10-1: a tenant registry change runs the start-up salt-pool rule.

``build()`` refuses to start when a replica with ``cache_salt: false`` is in a pool that more than one
tenant lists (its KV cache would be shared unsalted: the cross-tenant prefix-cache channel T1).
Before, ``Admin.apply_registry`` (``POST /admin/tenants/reload``, and a registry record adopted from
shared state) did not run it: a reload adding a second tenant to the salt-less pool answered 200 and
two tenants shared the replica's cache. Now the rule is one pure function
(:func:`gateway.salt_pools.salt_pool_error`) run by both: the reload answers 400 and the registry in
force stays; another instance's record that breaks it here is ignored, counted and logged.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import generate_latest

from gateway.app import build_admin_app
from gateway.build import build
from gateway.config import ConfigError, load_config
from gateway.auditing import AuditHub
from gateway.salt_pools import salt_pool_error
from tests.scaleout.conftest import redis_server  # noqa: F401 - fixture
from tests.scaleout.s2_instances import ISSUER, OPERATOR, instance, instance_doc, write_secret
from tests.support.waiting import wait_for

TD = "demo.prefixgate.test"


def _doc(tmp: Path, n: int, redis_url: str | None, secret: Path, *, salt_less: bool) -> dict[str, Any]:
    """Replica r3 in pool ``solo`` (salt-less unless ``salt_less`` is False); tenant-a lists ``solo``."""
    doc = instance_doc(tmp, n, redis_url or "redis://127.0.0.1:9", secret)
    if redis_url is None:
        doc.pop("state")
    doc["replicas"][3].update({"pool": "solo", "cache_salt": not salt_less})
    doc["tenancy"]["tenants"][0]["pools"] = ["default", "solo"]
    return doc


def _with_b(doc: dict[str, Any], pools: list[str]) -> dict[str, Any]:
    tenants = [t for t in doc["tenancy"]["tenants"] if t["id"] != "tenant-b"]
    tenants.append({"id": "tenant-b", "spiffe_ids": [f"spiffe://{TD}/tenant-b/"], "models": ["sim-model"],
                    "pools": pools})
    return {**doc, "tenancy": {**doc["tenancy"], "tenants": tenants}}


def _admin(gw: Any) -> httpx.AsyncClient:
    token = ISSUER.mint(OPERATOR, "prefixgate-admin")
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=build_admin_app(gw)), base_url="http://admin",
                             headers={"Authorization": f"Bearer {token}"})


async def test_a_reload_that_shares_a_salt_less_pool_is_refused(tmp_path: Path) -> None:
    secret = write_secret(tmp_path / "master.key")
    doc = _doc(tmp_path, 0, None, secret, salt_less=True)
    gw = instance(tmp_path, 0, "", secret, doc=doc)  # one tenant in the salt-less pool: starts
    path = tmp_path / "inst0" / "gateway.yaml"
    path.write_text(yaml.safe_dump(_with_b(doc, ["default", "solo"])))
    with pytest.raises(ConfigError, match="cache_salt off"):  # what a fresh start with this file says
        build(load_config(path), audit=AuditHub(None))
    async with _admin(gw) as admin:
        r = await admin.post("/admin/tenants/reload")
        assert r.status_code == 400, r.text
        assert "replica r3 has cache_salt off" in r.text and "tenant-a, tenant-b" in r.text
        assert gw.registry.get("tenant-b") is None  # the registry in force stays
        assert gw.registry.get("tenant-a").pools
        # tenant-b outside the salt-less pool: accepted
        path.write_text(yaml.safe_dump(_with_b(doc, ["default"])))
        assert (await admin.post("/admin/tenants/reload")).status_code == 200
        assert gw.registry.get("tenant-b") is not None
        # and moving tenant-b into it afterwards is refused again
        path.write_text(yaml.safe_dump(_with_b(doc, ["solo"])))
        assert (await admin.post("/admin/tenants/reload")).status_code == 400
        assert list(gw.registry.get("tenant-b").pools) == ["default"]


async def test_a_shared_registry_record_that_breaks_the_rule_here_is_ignored(tmp_path: Path, redis_server: Any,  # noqa: F811
                                                                            caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="prefixgate.state")
    secret = write_secret(tmp_path / "master.key")
    # instance 0: r3 salted (the rule holds there); instance 1: r3 salt-less
    docs = [_doc(tmp_path, n, redis_server.url, secret, salt_less=n == 1) for n in (0, 1)]
    a, b = (instance(tmp_path, n, redis_server.url, secret, doc=docs[n]) for n in (0, 1))
    try:
        for gw in (a, b):
            await gw.shared.start()
        (tmp_path / "inst0" / "gateway.yaml").write_text(yaml.safe_dump(_with_b(docs[0], ["solo"])))
        async with _admin(a) as admin:
            assert (await admin.post("/admin/tenants/reload")).status_code == 200
        assert a.registry.get("tenant-b") is not None
        await wait_for(lambda: b.shared.tenants.rejected >= 1, what="record refused by instance 1")
        assert b.registry.get("tenant-b") is None and b.shared.registry_version == 0
        assert "ignored tenants version 1" in caplog.text and "cache_salt off" in caplog.text
        assert b'prefixgate_shared_state_rejected_records_total{kind="tenants",reason="refused"} 1.0' \
            in generate_latest(b.metrics.admin)
        # a later record that keeps the rule is adopted (a refused one blocks nothing)
        (tmp_path / "inst0" / "gateway.yaml").write_text(yaml.safe_dump(_with_b(docs[0], ["default"])))
        async with _admin(a) as admin:
            assert (await admin.post("/admin/tenants/reload")).status_code == 200
        await wait_for(lambda: b.registry.get("tenant-b") is not None, what="valid record adopted")
        assert b.shared.registry_version == 2 and b.shared.tenants.rejected == 1
    finally:
        for gw in (a, b):
            await gw.shared.stop()


class _R:
    def __init__(self, id: str, pool: str, cache_salt: bool) -> None:
        self.id, self.pool, self.cache_salt = id, pool, cache_salt


class _T:
    def __init__(self, id: str, pools: list[str]) -> None:
        self.id, self.pools = id, pools


def test_the_rule_is_one_pure_function() -> None:
    reps = [_R("r0", "default", True), _R("r1", "solo", False)]
    assert salt_pool_error(reps, [_T("a", ["default", "solo"]), _T("b", ["default"])]) is None
    err = salt_pool_error(reps, [_T("b", ["solo"]), _T("a", ["solo"])])
    assert err is not None and "replica r1" in err and "'solo'" in err and "(a, b)" in err
    assert salt_pool_error([_R("r1", "solo", True)], [_T("b", ["solo"]), _T("a", ["solo"])]) is None
