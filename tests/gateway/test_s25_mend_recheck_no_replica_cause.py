"""Session 25 (mend, S24-fixreg-1): the re-check's 503 ``no_replica`` tells its two causes apart, with the
rule of the first check (gateway/pipeline_answer.py ``no_candidate_error``: one rule, one place).

A request queued while a registry reload moves its tenant to pools that hold no replica at all is
refused by :func:`gateway.pep_recheck.decide_again` with the message, audit reason and
``prefixgate_no_replica_total{cause="none_configured"}`` a fresh request gets. Before: the re-check said
"no healthy replica is available for this tenant" (read as an outage), with no reason and no count."""
from __future__ import annotations

from typing import Any

import pytest

from tests.gateway.test_s18_recheck_registry import event_of, queued_through, reload, tenant_a
from tests.support import audit_log as audit_fixtures
from tests.support import flow
from tests.support.audit_log import ListLog
from tests.support.flow import HOLD_UNTIL_CANCELLED

audit_log, audit_hub = audit_fixtures.audit_log, audit_fixtures.audit_hub  # the stack on a ListLog
replica_cfg, n_replicas = flow.replica_cfg, flow.n_replicas  # one slow replica (pool ``default``)


@pytest.fixture
def config_overrides() -> dict[str, Any]:
    return {**HOLD_UNTIL_CANCELLED, "flow": {"replica_max_running_requests": 1}}


async def test_pools_narrowed_to_an_empty_pool_while_queued_say_none_configured(stack: Any,
                                                                                audit_log: ListLog) -> None:
    async def narrow(st: Any) -> None:
        await reload(st, tenant_a(pools=["eu"]))  # no replica is in pool eu

    fresh, r = await queued_through(stack, narrow)
    assert fresh.status_code == 503 and r.status_code == 503
    assert r.json()["error"] == fresh.json()["error"]  # the queued request is told what a fresh one is
    assert r.json()["error"]["message"] == "no replica is configured in this tenant's pools"
    ev = event_of(audit_log, r)
    assert (ev.status_code, ev.error_code) == (503, "no_replica")
    assert ev.policy.reason == "no replica is configured in the tenant's pools (eu)"
    metrics = await stack.admin_metrics()
    assert 'prefixgate_no_replica_total{cause="none_configured",tenant="tenant-a"} 2.0' in metrics  # fresh + queued
