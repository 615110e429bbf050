"""Session 24 (S23-newcomer-5's rest): a tenant whose pools hold no replica at all is told so.

503 ``no_replica`` before the policy has two causes an operator must tell apart: no replica is in the
tenant's pools (a configuration gap; no retry mends it) or some are and none is routable now (down,
circuit open). The client's message says which without naming any pool; the audit event's ``reason``
names the tenant's own pools; ``prefixgate_no_replica{tenant, cause}`` counts each. Before: both
answered "no healthy replica is available for this tenant", with no reason and no metric.
"""
from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import TD
from tests.support import audit_log as audit_fixtures
from tests.support.audit_log import ListLog
from tests.support.waiting import wait_for

audit_log, audit_hub = audit_fixtures.audit_log, audit_fixtures.audit_hub  # the stack on a ListLog

BODY = {"model": "sim-model", "prompt": "hello there", "max_tokens": 4}


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    """tenant-gpu lists the pool ``gpu``, which no replica is in (the replicas are in ``default``, ``eu``)."""
    return {"tenancy": {
        "operators": [f"spiffe://{TD}/ops/admin"],
        "tenants": [
            {"id": "tenant-a", "spiffe_ids": [f"spiffe://{TD}/tenant-a/"], "models": ["sim-model"],
             "pools": ["default"], "max_output_tokens": 256},
            {"id": "tenant-gpu", "spiffe_ids": [f"spiffe://{TD}/tenant-gpu/"], "models": ["sim-model"],
             "pools": ["gpu"], "max_output_tokens": 256},
        ]}}


def _event(log: ListLog, answer: Any) -> Any:
    (ev,) = [e for e in log.events if getattr(e, "request_id", None) == answer.headers["x-request-id"]]
    return ev


async def test_no_replica_in_the_pools_is_told_apart_from_none_healthy(stack: Any, audit_log: ListLog) -> None:
    r = await stack.client.post("/v1/completions", json=BODY, headers=stack.auth("tenant-gpu/app"))
    assert r.status_code == 503 and r.json()["error"]["code"] == "no_replica"
    assert r.json()["error"]["message"] == "no replica is configured in this tenant's pools"
    assert "gpu" not in r.text and "default" not in r.text and "eu" not in r.text  # no pool named to the client
    ev = _event(audit_log, r)
    assert ev.policy.reason == "no replica is configured in the tenant's pools (gpu)" and ev.error_code == "no_replica"

    for runner in stack.cluster.runners:  # tenant-a's pool has replicas; all of them down
        await runner.cleanup()
    await wait_for(lambda: not stack.components.replica_set.routable_ids(), what="health checks mark all down")
    r2 = await stack.client.post("/v1/completions", json=BODY, headers=stack.auth())
    assert r2.status_code == 503 and r2.json()["error"]["message"] == "no healthy replica is available for this tenant"
    assert _event(audit_log, r2).policy.reason == "no replica of the tenant's pools (default) is routable now"

    metrics = await stack.admin_metrics()
    assert 'prefixgate_no_replica_total{cause="none_configured",tenant="tenant-gpu"} 1.0' in metrics
    assert 'prefixgate_no_replica_total{cause="none_healthy",tenant="tenant-a"} 1.0' in metrics
