"""Session 17 (helper post2, issue 14): :meth:`routing.calibration.Calibration.flush` applies the queued
first bytes and rebuilds the estimates with fewer calls (the replica's fits looked up inline, the estimate
built inside :meth:`Calibration.estimate`, no generator for one observation); what every read returns is
exactly what the same observations give applied at once, one or many queued, over several replicas
and tenants, with and without an engine sample."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.calibration import Calibration, EngineSample

_OBS = st.lists(st.tuples(st.sampled_from(["r0", "r1", "r2"]), st.sampled_from(["", "a", "b"]),
                          st.floats(0, 4000), st.floats(0, 8000), st.floats(0, 3.0),
                          st.one_of(st.none(), st.floats(0, 8000)), st.integers(1, 4)),
                min_size=1, max_size=120)


@settings(max_examples=120, deadline=None)
@given(_OBS)
def test_deferred_flushes_read_what_immediate_observations_give(obs: list[tuple]) -> None:
    now = Calibration(prior_rate=5000.0, min_samples=3)
    later = Calibration(prior_rate=5000.0, min_samples=3)
    later.defer_observations(True)
    sample = EngineSample(running=1.0, waiting=2.0)
    now.observe_engine("r2", sample, own_requests=1)
    later.observe_engine("r2", sample, own_requests=1)
    batch = 0
    for rid, tenant, u, q, y, s, every in obs:
        now.observe_first_byte(rid, u, q, y, s, tenant=tenant)
        later.observe_first_byte(rid, u, q, y, s, tenant=tenant)
        batch += 1
        if batch >= every:  # one observation per flush (an answer's) or several (a burst's)
            later.flush()
            batch = 0
            assert later.pending == 0
            for r, built in later._built.items():  # rebuilt by the flush, ready for the next decision
                assert built[4] == now.estimate(r)
    for r in ("r0", "r1", "r2", "r3"):
        assert later.estimate(r) == now.estimate(r)
        assert later.observations(r) == now.observations(r)
