"""R3-14: concentration alerts attributed to the tenants that cause them (audit/attribution.py,
audit/concentration.py, the config keys and the gateway's observation)."""
from __future__ import annotations

from typing import Any

from audit.attribution import attribute_concentration
from audit.concentration import ConcentrationMonitor
from audit.config_schema import ConcentrationSection
from audit.event import Outcome


def test_evenly_spread_tenant_contributes_nothing() -> None:
    # 2 replicas: acme piles 100 onto r; globex spreads 100 evenly (50 on r)
    assert attribute_concentration({"acme": 100, "globex": 50}, {"acme": 100, "globex": 100}, 2) == ("acme",)


def test_cover_ratio_and_max_tenants() -> None:
    on = {"a": 40.0, "b": 40.0, "c": 20.0}
    pool = dict(on)
    assert attribute_concentration(on, pool, 2, cover_ratio=0.8) == ("a", "b")
    assert attribute_concentration(on, pool, 2, cover_ratio=0.8, max_tenants=1) is None
    assert attribute_concentration(on, pool, 2, cover_ratio=1.0) == ("a", "b", "c")


def test_unattributed_traffic_or_no_excess_is_global() -> None:
    assert attribute_concentration({None: 100.0, "a": 5.0}, {None: 100.0, "a": 5.0}, 2) is None
    assert attribute_concentration({"a": 50.0}, {"a": 100.0}, 2) is None  # exactly the fair share


def _feed(mon: ConcentrationMonitor, t0: float, seconds: float, rates: dict[tuple[str, str], float]) -> float:
    step, t = 0.05, t0
    acc = dict.fromkeys(rates, 0.0)
    while t < t0 + seconds:
        for (tenant, replica), rate in rates.items():
            acc[(tenant, replica)] += rate * step
            while acc[(tenant, replica)] >= 1:
                acc[(tenant, replica)] -= 1
                mon.observe("p", replica, 50, 100, 50, t, tenant=tenant)
        t += step
    return t


def test_a_second_tenant_is_added_and_every_alert_clears() -> None:
    events: list[Any] = []
    mon = ConcentrationMonitor(window_s=10, hold_s=5, on_alert=events.append, pools={"p": ["r1", "r2"]})
    t = _feed(mon, 0.0, 20, {("acme", "r1"): 5.0, ("globex", "r2"): 1.0})
    assert [a["tenant_id"] for a in mon.active_alerts() if a["kind"] == "replica_concentration"] == ["acme"]
    # acme is steered to r2; initech now piles onto r1 and keeps it concentrated
    t = _feed(mon, t, 20, {("initech", "r1"): 8.0, ("acme", "r2"): 1.0, ("globex", "r2"): 1.0})
    rep = [(a["id"], a["tenant_id"]) for a in mon.active_alerts() if a["kind"] == "replica_concentration"]
    assert rep == [("replica_concentration:p:r1:acme", "acme"), ("replica_concentration:p:r1:initech", "initech")]
    _feed(mon, t, 30, {("initech", "r1"): 1.0, ("initech", "r2"): 1.0, ("globex", "r1"): 1.0, ("globex", "r2"): 1.0})
    assert mon.active_alerts() == []
    rep_events = [(e.outcome, e.alert.get("tenant_id")) for e in events if e.alert["alert_kind"] == "replica_concentration"]
    assert rep_events == [(Outcome.RAISED, "acme"), (Outcome.RAISED, "initech"),
                          (Outcome.CLEARED, "acme"), (Outcome.CLEARED, "initech")]


def test_too_many_tenants_widen_to_the_global_alert() -> None:
    mon = ConcentrationMonitor(window_s=10, hold_s=5, pools={"p": ["r1", "r2"]}, attribution_max_tenants=1)
    t = _feed(mon, 0.0, 20, {("acme", "r1"): 5.0})
    _feed(mon, t, 20, {("initech", "r1"): 8.0})
    assert sorted((a["tenant_id"] or "") for a in mon.active_alerts() if a["kind"] == "replica_concentration") == [
        "", "acme"]


def test_attribution_off_gives_global_alerts() -> None:
    mon = ConcentrationMonitor(window_s=10, hold_s=5, pools={"p": ["r1", "r2"]}, attribution_max_tenants=0)
    _feed(mon, 0.0, 20, {("acme", "r1"): 5.0})
    assert [a["tenant_id"] for a in mon.active_alerts() if a["kind"] == "replica_concentration"] == [None]


def test_config_keys_reach_the_monitor() -> None:
    section = ConcentrationSection.model_validate({"attribution_cover_ratio": 0.6, "attribution_max_tenants": 2})
    mon = ConcentrationMonitor(**section.model_dump(exclude_unset=True))
    assert (mon.attribution_cover_ratio, mon.attribution_max_tenants) == (0.6, 2)


def test_gateway_observation_carries_the_tenant() -> None:
    from gateway.auditing import AuditHub
    from gateway.record import RequestRecord

    mon = ConcentrationMonitor(window_s=10, hold_s=0, min_requests=5, pools={"p": ["r1", "r2"]},
                               eval_interval_s=0)  # every observation checked (no staleness: session 7)
    hub = AuditHub(None, monitor=mon)
    for i in range(10):
        rec = RequestRecord(request_id=f"r{i}", endpoint="/v1/chat/completions", client_addr=None, t0=0.0,
                            tenant_id="acme")
        rec.outcome, rec.replica, rec.pool, rec.prompt_tokens = "allowed", "r1", "p", 100
        hub.observe_request(rec)
    assert [a["tenant_id"] for a in mon.active_alerts() if a["kind"] == "replica_concentration"] == ["acme"]


def test_attributed_alert_event_round_trips_and_maps_to_ocsf() -> None:
    from audit.event import AuditEvent
    from audit.ocsf import to_ocsf, validate_ocsf

    events: list[Any] = []
    mon = ConcentrationMonitor(window_s=10, hold_s=5, on_alert=events.append, pools={"p": ["r1", "r2"]})
    _feed(mon, 0.0, 20, {("acme", "r1"): 5.0})
    ev = next(e for e in events if e.alert["alert_kind"] == "replica_concentration")
    assert AuditEvent.from_dict(ev.to_dict()) == ev  # schema "4" reader accepts it
    doc = to_ocsf(ev)
    validate_ocsf(doc)
    assert doc["metadata"]["tenant_uid"] == "acme"
    assert doc["finding_info"]["uid"] == "replica_concentration:p:r1:acme"
