"""The concentration rule at app level: an active concentration alert on a
replica, in the policy input, removes that replica from the allowed set when
other healthy entitled replicas remain (rego/authz.rego), in embedded and
remote mode.

The first test closes the whole loop with the real monitor
(audit.concentration.ConcentrationMonitor behind the gateway's AuditHub):
cache-aware routing piles one conversation's requests on one replica, the
monitor raises ``replica_concentration`` for it, and the next requests go
elsewhere. The second uses a stub monitor to check the fallback (every
candidate alerted: keep routing) and tenant-scoped alerts.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from audit.concentration import ConcentrationMonitor
from gateway.auditing import AuditHub

PROMPT = "one long shared system prompt " + " ".join(f"w{i}" for i in range(60))


def body(i: int) -> dict[str, Any]:
    return {"model": "sim-model", "prompt": f"{PROMPT} turn {i}", "max_tokens": 2}


def routed(log: Any) -> list[str]:
    return [e.route.replica for e in log.events if e.request_id and e.route.replica]


@pytest.fixture
def monitor() -> ConcentrationMonitor:
    # raise at once (no hold), after 5 requests in the pool's window, at a
    # fixed share of 0.7 (clears below 0.56): independent of the default
    # threshold formula, which the audit package tunes
    return ConcentrationMonitor(window_s=600, hold_s=0, min_requests=5, share_threshold=0.7,
                                eval_interval_s=0)  # what the test reads is what the policy reads


@pytest.fixture
def audit_hub(audit_log: Any, monitor: ConcentrationMonitor) -> AuditHub:
    return AuditHub(audit_log, monitor=monitor)


async def post(stack: Any, log: Any, h: dict[str, str], payload: dict[str, Any]) -> None:
    """One request, then wait until its audit event (and so its monitor
    observation) is recorded: the gateway may record after the response."""
    n = sum(1 for e in log.events if e.request_id)
    r = await stack.client.post("/v1/completions", headers=h, json=payload)
    assert r.status_code == 200, r.text
    for _ in range(500):
        if sum(1 for e in log.events if e.request_id) > n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("request was not audited")


def hot_replicas(monitor: ConcentrationMonitor) -> set[str]:
    return {a["replica"] for a in monitor.active_alerts() if a["kind"] == "replica_concentration"}


async def test_monitor_alert_steers_routing_away_from_the_hot_replica(
    stack: Any, audit_log: Any, monitor: ConcentrationMonitor, pdp_mode: str
) -> None:
    h = stack.auth("tenant-a/app")
    # The monitor judges a pool once it has seen two of its replicas: distinct
    # prompts until both default replicas served one.
    for i in range(12):
        await post(stack, audit_log, h, {"model": "sim-model", "prompt": f"warm {i} " * (20 + i), "max_tokens": 2})
        if set(routed(audit_log)) == {"r0", "r1"}:
            break
    assert set(routed(audit_log)) == {"r0", "r1"}
    # One conversation: cache-aware routing keeps its shared prefix on one replica until it is hot.
    for i in range(20):
        await post(stack, audit_log, h, body(i))
        if hot_replicas(monitor):
            break
    assert len(hot_replicas(monitor)) == 1, (routed(audit_log), monitor.stats("default"))
    (hot,) = hot_replicas(monitor)
    # Which replica the monitor calls hot depends on how the warm-up spread (timing);
    # what matters is that it is one of the pool's replicas and is then avoided.
    assert hot in {"r0", "r1"}
    # While the alert is active, no request reaches the hot replica (the other one is healthy).
    steered = 0
    for i in range(20, 26):
        active = hot in hot_replicas(monitor)
        await post(stack, audit_log, h, body(i))
        if active:
            assert routed(audit_log)[-1] != hot
            steered += 1
    assert steered >= 1
    assert "r2" not in routed(audit_log)  # never the reserved eu pool


class StubMonitor:
    """Fixed active alerts in the monitor's shape; observations ignored."""

    def __init__(self, alerts: list[dict[str, Any]]) -> None:
        self.alerts = alerts

    def active_alerts(self) -> list[dict[str, Any]]:
        return list(self.alerts)

    def observe(self, *args: Any) -> None:
        return None


def alert(replica: str, kind: str = "replica_concentration") -> dict[str, Any]:
    return {"id": f"{kind}:default:{replica}", "kind": kind, "pool": "default", "replica": replica, "since": 1.0}


async def test_alert_rule_keeps_routing_when_every_candidate_is_alerted(
    stack: Any, audit_log: Any, pdp_mode: str
) -> None:
    h = stack.auth("tenant-a/app")
    stack.components.audit.monitor = StubMonitor([alert("r0")])
    for i in range(4):
        assert (await stack.client.post("/v1/completions", headers=h, json=body(i))).status_code == 200
    assert set(routed(audit_log)) == {"r1"}
    # both default replicas alerted: no healthy unalerted one remains, so both stay allowed
    stack.components.audit.monitor = StubMonitor([alert("r0"), alert("r1")])
    for i in range(4, 8):
        assert (await stack.client.post("/v1/completions", headers=h, json=body(i))).status_code == 200
    assert set(routed(audit_log)[4:]) <= {"r0", "r1"}
    # an alert scoped to another tenant does not apply to tenant-a
    stack.components.audit.monitor = StubMonitor([{**alert("r1"), "tenant_id": "tenant-b"}])
    for i in range(8, 12):
        assert (await stack.client.post("/v1/completions", headers=h, json=body(i))).status_code == 200
    # the prefix lives on r1 (first phase): with no applicable alert cache-aware routing returns there
    assert "r1" in routed(audit_log)[8:]
