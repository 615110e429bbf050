"""Issue 14 (session 7): the policy's per-request read of the active alerts reuses the last
computed alert set while it is younger than ``eval_interval_s`` (bounded staleness), instead of
running the pending alert checks on every read. Figures older than that bound are never served."""

from __future__ import annotations

from audit.concentration import ConcentrationMonitor


class _Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _counting(mon: ConcentrationMonitor) -> list[int]:
    calls: list[int] = []
    real = mon._evaluate

    def counted(*a, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        return real(*a, **kw)

    mon._evaluate = counted  # type: ignore[method-assign]
    return calls


def _monitor(clock: _Clock, alerts: list, interval: float = 0.05) -> ConcentrationMonitor:
    return ConcentrationMonitor(window_s=10, hold_s=1.0, min_requests=4, share_threshold=0.7,
                                pools={"p": ["a", "b"]}, on_alert=alerts.append, eval_interval_s=interval,
                                attribution_max_tenants=0, clock=clock)


def test_reads_within_the_interval_reuse_the_last_alert_set() -> None:
    clock, alerts = _Clock(), []
    mon = _monitor(clock, alerts)
    mon.observe("p", "a", 10, 10, 0, clock.t)  # first observation: evaluated
    calls = _counting(mon)
    for _ in range(200):  # 200 requests in 20 ms, each read by the policy first (gateway/pep.py)
        clock.t += 0.0001
        mon.active_alerts()
        mon.observe("p", "a", 10, 10, 0, clock.t)
    assert len(calls) <= 2  # not one per read


def test_no_read_serves_an_alert_set_older_than_the_interval() -> None:
    clock, alerts = _Clock(), []
    mon = _monitor(clock, alerts, interval=0.5)
    t0 = clock.t
    for i in range(20):  # a burst: judged from the 4th request on (min_requests), all on a
        mon.observe("p", "a", 10, 10, 0, t0 + i * 1e-4)  # only the first is evaluated
    calls = _counting(mon)
    clock.t = t0 + 0.1
    assert mon.active_alerts() == [] and not calls  # the set computed at t0 is younger than the bound
    clock.t = t0 + 0.6
    mon.active_alerts()  # older than the bound: the read runs the pending checks (the breach starts)
    assert len(calls) == 1
    clock.t = t0 + 1.1
    mon.observe("p", "a", 10, 10, 0, clock.t)  # due: evaluated; the hold (1 s) counts from the burst
    assert [a["id"] for a in mon.active_alerts()] == ["replica_concentration:p:a", "pool_concentration:p:"]
    assert alerts


def test_interval_zero_reads_see_every_observation() -> None:
    clock, alerts = _Clock(), []
    mon = _monitor(clock, alerts, interval=0.0)
    for i in range(5):
        mon.observe("p", "a", 10, 10, 0, float(i))
    mon.observe("p", "a", 10, 10, 0, 5.0)
    assert [a["id"] for a in mon.active_alerts()] == ["replica_concentration:p:a", "pool_concentration:p:"]


def test_the_cached_set_follows_raises_and_clears() -> None:
    clock, alerts = _Clock(), []
    mon = _monitor(clock, alerts)
    t = 0.0
    for _ in range(20):
        t += 0.1
        clock.t += 0.1
        mon.observe("p", "a", 10, 10, 0, t)
        mon.active_alerts()
    assert {a["kind"] for a in mon.active_alerts()} == {"replica_concentration", "pool_concentration"}
    for _ in range(100):  # traffic moves to b, slowly enough that every observation is evaluated
        t += 0.1
        clock.t += 0.1
        mon.observe("p", "b", 10, 10, 0, t)
    assert not [a for a in mon.active_alerts() if a["replica"] == "a"]
