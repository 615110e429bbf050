"""The same decision tests through the embedded engine and remote OPA."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from policy.decision import Decision, DecisionPoint
from policy.embedded import EmbeddedOpa
from policy.remote import RemoteOpa


@pytest.fixture(params=["embedded", "remote"])
async def pdp(request: pytest.FixtureRequest, rego_dir: Any) -> AsyncIterator[DecisionPoint]:
    if request.param == "embedded":
        yield EmbeddedOpa(rego_dir)
        return
    server = request.getfixturevalue("opa_server")
    remote = RemoteOpa(server.url, timeout_s=5.0)
    await remote.start()
    try:
        yield remote
    finally:
        await remote.close()


async def test_entitled_request_allowed(pdp: DecisionPoint, mk: Any) -> None:
    d = await pdp.decide(mk("tenant-a"))
    assert isinstance(d, Decision)
    assert d.allow is True and d.reason_code == "allowed"
    assert d.allowed_replicas == {"r-d1", "r-d2"}
    assert d.allowed_pools == {"default"}
    assert d.decision_id and not d.cached


async def test_model_not_entitled_denied(pdp: DecisionPoint, mk: Any) -> None:
    d = await pdp.decide(mk("tenant-a", model="other-model"))
    assert d.allow is False
    assert d.reason_code == "model_not_entitled"
    assert d.allowed_replicas is None and d.max_tokens is None


async def test_tenant_without_entitlements_denied(pdp: DecisionPoint, mk: Any) -> None:
    # a tenant the registry gives no models is served nothing; the reason says why
    d = await pdp.decide(mk("tenant-zzz", entitlements={"tier": "standard"}))
    assert (d.allow, d.reason_code) == (False, "model_not_entitled")
    assert "tenancy.tenants[].models" in (d.reason or "")


async def test_regulated_tenant_only_gets_eu_replicas(pdp: DecisionPoint, mk: Any) -> None:
    d = await pdp.decide(mk("tenant-reg"))
    assert d.allow is True
    assert d.allowed_replicas == {"r-e1", "r-e2"}


async def test_regulated_tenant_denied_without_eu_candidates(pdp: DecisionPoint, mk: Any) -> None:
    default_only = [c for c in (await _cands(mk)) if c["pool"] == "default"]
    d = await pdp.decide(mk("tenant-reg", candidates=default_only))
    assert (d.allow, d.reason_code) == (False, "no_entitled_replica")


async def _cands(mk: Any) -> list[dict[str, Any]]:
    return mk()["candidates"]


async def test_non_regulated_never_gets_eu(pdp: DecisionPoint, mk: Any) -> None:
    # tenant-b's entitlement lists the eu pool; the reserved-pool rule still wins
    d = await pdp.decide(mk("tenant-b"))
    assert d.allow is True
    assert d.allowed_pools == {"default"}
    assert not d.allowed_replicas & {"r-e1", "r-e2"}
    eu_only = [c for c in (await _cands(mk)) if c["pool"] == "eu"]
    d2 = await pdp.decide(mk("tenant-b", candidates=eu_only))
    assert (d2.allow, d2.reason_code) == (False, "no_entitled_replica")


async def test_deny_listed_workload_denied(pdp: DecisionPoint, mk: Any, ids: dict[str, str]) -> None:
    d = await pdp.decide(mk("tenant-a", spiffe_id=ids["denied"]))
    assert (d.allow, d.reason_code) == (False, "workload_denied")


async def test_tier_max_tokens_cap(pdp: DecisionPoint, mk: Any) -> None:
    assert (await pdp.decide(mk("tenant-a"))).max_tokens == 1024
    assert (await pdp.decide(mk("tenant-reg"))).max_tokens == 4096
    assert (await pdp.decide(mk("tenant-a", tenant_max_tokens=300))).max_tokens == 300
    over = await pdp.decide(mk("tenant-a", max_tokens=1025))
    assert (over.allow, over.max_tokens) == (True, 1024)  # capped by the PEP, not denied
    at = await pdp.decide(mk("tenant-a", max_tokens=1024))
    assert at.allow is True


async def test_concentration_alert_removes_replica(pdp: DecisionPoint, mk: Any) -> None:
    alert = {"id": "al-1", "kind": "concentration", "replica_id": "r-d1", "tenant_id": None}
    d = await pdp.decide(mk("tenant-a", alerts=[alert]))
    assert d.allow is True and d.allowed_replicas == {"r-d2"}


async def test_concentration_alert_ignored_when_no_other_healthy(pdp: DecisionPoint, mk: Any) -> None:
    cands = [
        {"id": "r-d1", "pool": "default", "labels": {}, "healthy": True, "load": 9},
        {"id": "r-d2", "pool": "default", "labels": {}, "healthy": False, "load": 0},
    ]
    alert = {"id": "al-1", "kind": "concentration", "replica_id": "r-d1", "tenant_id": None}
    d = await pdp.decide(mk("tenant-a", candidates=cands, alerts=[alert]))
    assert d.allow is True and "r-d1" in d.allowed_replicas


async def test_decision_ids_are_unique(pdp: DecisionPoint, mk: Any) -> None:
    a = await pdp.decide(mk("tenant-a"))
    b = await pdp.decide(mk("tenant-a"))
    assert a.decision_id != b.decision_id
