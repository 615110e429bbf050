"""Issue 14 (session 6): the concentration monitor evaluates lazily.

Observations only update the window; the figures and alert checks run at most once per
``eval_interval_s`` or every ``EVAL_EVERY`` observations, and before any read (policy input:
``active_alerts``; metrics: ``stats`` and a registry scrape), so a read sees every observation.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from audit.concentration import ConcentrationMonitor


def _counting(mon: ConcentrationMonitor) -> list[int]:
    calls: list[int] = []
    real = mon._evaluate

    def counted(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*a, **kw)

    mon._evaluate = counted  # type: ignore[method-assign]
    return calls


def test_evaluations_per_observations_are_bounded() -> None:
    mon = ConcentrationMonitor(window_s=60, pools={"p": ["a", "b"]}, eval_interval_s=0.05)
    calls = _counting(mon)
    now = 100.0
    for i in range(2000):  # 2000 observations in 0.2 s (10 000/s), nothing reads
        now += 0.0001
        mon.observe("p", "ab"[i % 2], 10, 10, 0, now)
    # one per 50 ms (4 in 0.2 s) plus the first, and never more than one per EVAL_EVERY observations
    assert len(calls) <= 2000 // mon.EVAL_EVERY + 6
    assert len(calls) >= 2000 // mon.EVAL_EVERY  # evaluated at least every EVAL_EVERY observations


def test_reads_see_every_observation() -> None:
    pub, adm = CollectorRegistry(), CollectorRegistry()
    mon = ConcentrationMonitor(window_s=60, pools={"p": ["a", "b"]}, registry=pub, admin_registry=adm,
                               eval_interval_s=3600)
    mon.observe("p", "a", 10, 10, 0, 1.0)  # first observation: evaluated
    for i in range(9):
        mon.observe("p", "b", 10, 10, 5, 1.0 + i * 1e-4)
    assert mon.stats("p")["requests"] == 10
    assert mon.stats("p")["shares"] == {"a": 0.1, "b": 0.9}
    labels = {"pool": "p", "replica": "b"}
    mon.observe("p", "b", 10, 10, 10, 1.01)
    assert adm.get_sample_value("prefixgate_replica_request_share", labels) == 10 / 11  # a scrape flushes
    assert pub.get_sample_value("prefixgate_pool_prefix_hit_rate", {"pool": "p"}) == (45 + 10) / 110


def test_alerts_fire_and_clear_for_the_policy_read_without_waiting_for_the_interval() -> None:
    # session 7: a read runs the pending checks once the last set is eval_interval_s old on the
    # monitor's clock (here the observations' own clock, as in the gateway: time.monotonic)
    alerts: list = []
    clock = [0.0]
    mon = ConcentrationMonitor(window_s=10, hold_s=1.0, min_requests=4, share_threshold=0.7,
                               pools={"p": ["a", "b"]}, on_alert=alerts.append, eval_interval_s=0.05,
                               attribution_max_tenants=0, clock=lambda: clock[0])
    t = 0.0
    for _ in range(20):  # the policy reads before every request, as gateway/pep.py does
        mon.active_alerts()
        t += 0.1
        clock[0] = t
        mon.observe("p", "a", 10, 10, 0, t)
    # breach from t=0.4 (4 requests), hold 1 s: raised by the read after the observation at t=1.4
    assert mon.active_alerts()[0]["id"] == "replica_concentration:p:a"  # the read ran the checks
    assert alerts[0].alert["observed_at_s"] in (1.4, 1.5)  # as when every observation was evaluated
    assert {e.alert["alert_kind"] for e in alerts} == {"replica_concentration", "pool_concentration"}
    for _ in range(60):  # traffic moves to b; the read sees a's share fall below the clear level
        t += 0.01
        mon.observe("p", "b", 10, 10, 0, t)
    clock[0] = t + 0.05
    assert not [a for a in mon.active_alerts() if a["replica"] == "a"]
    assert "cleared" in [e.outcome.value for e in alerts]


def test_interval_alone_raises_alerts_within_one_interval() -> None:
    alerts: list = []
    mon = ConcentrationMonitor(window_s=10, hold_s=1.0, min_requests=4, share_threshold=0.7,
                               pools={"p": ["a", "b"]}, on_alert=alerts.append, eval_interval_s=0.05,
                               attribution_max_tenants=0)
    t = 0.0
    while not alerts and t < 5:
        t += 0.001
        mon.observe("p", "a", 10, 10, 0, t)  # nothing reads
    assert alerts and alerts[0].alert["observed_at_s"] <= 1.0 + 0.05 + 0.01 + 0.001 * 4
