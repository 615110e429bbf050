"""R3-14: a replica concentration caused by one tenant is attributed to it, so the
shipped policy steers only that tenant away (monitor + embedded policy evaluation)."""

from __future__ import annotations

from typing import Any

from audit.concentration import ConcentrationMonitor
from audit.event import Outcome
from policy.embedded import EmbeddedOpa

POOL = "default"


def _feed(mon: ConcentrationMonitor, t0: float, seconds: float, rates: dict[tuple[str, str], float]) -> float:
    """Observe ``rates[(tenant, replica)]`` requests/s for ``seconds``; returns the end time."""
    step = 0.05
    t = t0
    acc = dict.fromkeys(rates, 0.0)
    while t < t0 + seconds:
        for key, rate in rates.items():
            acc[key] += rate * step
            while acc[key] >= 1:
                acc[key] -= 1
                tenant, replica = key
                mon.observe(POOL, replica, 50, 100, 50, t, tenant=tenant)
        t += step
    return t


def _monitor(alerts: list[Any]) -> ConcentrationMonitor:
    return ConcentrationMonitor(window_s=10, hold_s=5, on_alert=alerts.append, pools={POOL: ["r-d1", "r-d2"]})


def test_one_tenant_concentrating_a_replica_is_named() -> None:
    alerts: list[Any] = []
    mon = _monitor(alerts)
    # the review's scenario: acme sticks to r-d1 with one hot prefix; globex's warm prefix is on r-d1 too
    _feed(mon, 0.0, 30, {("acme", "r-d1"): 5.0, ("globex", "r-d1"): 0.5})
    rep = [a for a in mon.active_alerts() if a["kind"] == "replica_concentration"]
    assert [(a["replica_id"], a["tenant_id"]) for a in rep] == [("r-d1", "acme")]
    raised = [e for e in alerts if e.outcome is Outcome.RAISED and e.alert["alert_kind"] == "replica_concentration"]
    assert len(raised) == 1 and raised[0].alert["tenant_id"] == "acme" and raised[0].tenant == "acme"
    assert raised[0].alert["alert_id"] != "replica_concentration:default:r-d1"  # a tenant alert has its own id


def test_unattributable_concentration_stays_global() -> None:
    alerts: list[Any] = []
    mon = _monitor(alerts)
    # five tenants, each with the same share of r-d1: no small set explains it
    _feed(mon, 0.0, 30, {(f"t{i}", "r-d1"): 1.0 for i in range(5)})
    rep = [a for a in mon.active_alerts() if a["kind"] == "replica_concentration"]
    assert [(a["replica_id"], a["tenant_id"]) for a in rep] == [("r-d1", None)]


def test_untenanted_observations_give_global_alert() -> None:
    mon = ConcentrationMonitor(window_s=10, hold_s=5, pools={POOL: ["r-d1", "r-d2"]})
    t = 0.0
    while t < 30:
        mon.observe(POOL, "r-d1", 50, 100, 50, t)
        t += 0.2
    rep = [a for a in mon.active_alerts() if a["kind"] == "replica_concentration"]
    assert [a["tenant_id"] for a in rep] == [None]


def _cands() -> list[dict[str, Any]]:
    return [{"id": r, "pool": POOL, "labels": {}, "healthy": True, "load": 0} for r in ("r-d1", "r-d2")]


async def test_policy_steers_only_the_concentrating_tenant(rego_dir: Any, mk: Any) -> None:
    mon = _monitor([])
    _feed(mon, 0.0, 30, {("acme", "r-d1"): 5.0, ("globex", "r-d1"): 0.5})
    active = mon.active_alerts()
    pdp = EmbeddedOpa(rego_dir)
    facts = {"tier": "standard", "models": ["sim-model"], "pools": [POOL], "regulated": False}
    acme = await pdp.decide(mk("acme", candidates=_cands(), alerts=active, entitlements=facts))
    globex = await pdp.decide(mk("globex", candidates=_cands(), alerts=active, entitlements=facts))
    assert acme.allow and acme.allowed_replicas == {"r-d2"}
    assert globex.allow and globex.allowed_replicas == {"r-d1", "r-d2"}
