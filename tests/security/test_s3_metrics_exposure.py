"""R3-5: the public listener's unauthenticated ``GET /metrics`` carries liveness and overload
figures only; request counts, prompt and prefix tokens, latencies, concentration, audit and
per-tenant/per-replica series are served only by the admin listener to operators."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.auditing import AuditHub
from tests.support.audit_log import file_audit_hub

#: the whole public exposition (metrics.public_endpoint: minimal)
PUBLIC_FAMILIES = {"prefixgate_healthy_replicas", "prefixgate_audit_dropped_events", "prefixgate_state_available",
                   "prefixgate_shed_requests_total"}  # the queue gauge moved to admin (R4-11)
#: families that move with one request's size, prefix reuse, timing, tenant or replica
SENSITIVE = ("prefixgate_prompt_tokens", "prefixgate_prefix_tokens", "prefixgate_requests_total",
             "prefixgate_request_duration_seconds", "prefixgate_time_to_first_byte_seconds",
             "prefixgate_pool_prefix_hit_rate", "prefixgate_pool_concentration_hhi",
             "prefixgate_concentration_alerts_active", "prefixgate_upstream_failures",
             "prefixgate_policy_cache_lookups", "prefixgate_flow_queue_wait_seconds", "prefixgate_flow_refused",
             "prefixgate_audit_events_emitted", "prefixgate_tenant_", "prefixgate_replica_",
             "prefixgate_flow_queued_requests")
PROMPT = " ".join(f"secretword{i}" for i in range(300))


@pytest.fixture
def audit_hub(tmp_path: Path) -> AuditHub:
    """A real audit hub (log, concentration monitor, tracing metrics), as the gateway builds it."""
    return file_audit_hub(tmp_path)


def families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}


async def chat(stack: Any, content: str) -> None:
    r = await stack.client.post("/v1/chat/completions", headers=stack.auth("tenant-b/victim"),
                                json={"model": "sim-model", "max_tokens": 4,
                                      "messages": [{"role": "user", "content": content}]})
    assert r.status_code == 200, r.text


async def test_public_metrics_do_not_move_with_another_tenants_requests(stack: Any) -> None:
    """The review's probe (review-scripts/metrics_leak.sh): no token, diff /metrics around a
    victim's request and its continuation. Nothing moves; the admin exposition does."""
    before = await stack.client.get("/metrics")
    assert before.status_code == 200
    admin_before = await stack.admin_metrics()
    await chat(stack, PROMPT)
    await chat(stack, PROMPT + " more")
    after = (await stack.client.get("/metrics")).text
    assert after == before.text
    assert families(after) == PUBLIC_FAMILIES
    for name in SENSITIVE:
        assert name not in after, name
    admin_after = await stack.admin_metrics()
    assert admin_after != admin_before
    for name in SENSITIVE:
        assert name in admin_after, name
    assert PUBLIC_FAMILIES <= families(admin_after)  # operators see the public figures too
    delivered = [ln for ln in admin_after.splitlines() if ln.startswith('prefixgate_prefix_tokens_total{kind="delivered"}')]
    assert delivered and float(delivered[0].rsplit(" ", 1)[1]) > 0  # the second turn reused the first's prefix


async def test_admin_metrics_need_an_operator(stack: Any) -> None:
    assert (await stack.client.get(f"{stack.admin_url}/admin/metrics")).status_code == 401
    tenant_admin_aud = {"Authorization": f"Bearer {stack.token('tenant-b/victim', 'prefixgate-admin')}"}
    r = await stack.client.get(f"{stack.admin_url}/admin/metrics", headers=tenant_admin_aud)
    assert r.status_code == 403 and "prefixgate_" not in r.text


@pytest.mark.parametrize("config_overrides", [{"metrics": {"public_endpoint": "off"}}])
async def test_public_metrics_can_be_turned_off(stack: Any) -> None:
    r = await stack.client.get("/metrics")
    assert r.status_code == 404 and "prefixgate_" not in r.text
    assert PUBLIC_FAMILIES <= families(await stack.admin_metrics())
