"""R10-3: one tenant must not move the per-replica prefill-rate calibration every tenant's routing uses.

The reviewer's unit reproduction (notes/review10-scripts/calib_poison.py): honest first bytes
(u uncached tokens, ttft = u / 10000 tok/s + 20 ms, ±10 %) interleaved with an attacker's whose
predicted uncached tokens are small (or large) but whose first byte comes at 0.8 s (a real engine
prefilling tokens the router counted as cached or did not hash: chat ``tools``, a ``json_schema``
compiling). Before session 11 one fit per replica took every tenant's observations: the replica
looked 2-4x slower or had no estimate at all (which switched calibration off for the whole pool).
Now each (replica, tenant) has its own fit and the replica gets the upper-median tenant's
(routing/calibration_tenants.py); a fit that stops identifying a rate keeps its last good one;
requests with unhashed parts do not feed it."""

from __future__ import annotations

import math
import random

import pytest

from routing.calibration import CalibratingLoadTracker, Calibration, PrefillRateEstimator
from routing.load import InProcessLoadTracker
from routing.types import RouteRequest

RATE = 10000.0


def _honest(rng: random.Random) -> tuple[int, float]:
    u = rng.randint(100, 2000)
    return u, (u / RATE + 0.02) * rng.uniform(0.9, 1.1)


def _feed(cal: Calibration, replica: str, honest_tenants: list[str], attacker: str | None, au: int, ratio: int,
          rounds: int = 400, seed: int = 1) -> None:
    rng = random.Random(seed)
    for i in range(rounds):
        u, y = _honest(rng)
        cal.observe_first_byte(replica, u, 0.0, y, None, honest_tenants[i % len(honest_tenants)])
        if attacker is not None and ratio and i % ratio == 0:
            cal.observe_first_byte(replica, au, 0.0, 0.8, None, attacker)


@pytest.mark.parametrize("au", [16, 1500, 4000])
@pytest.mark.parametrize("ratio", [1, 3, 10])
@pytest.mark.parametrize("honest", [2, 3, 4])
def test_one_tenant_does_not_move_the_replica_estimate(au: int, ratio: int, honest: int) -> None:
    cal = Calibration(prior_rate=RATE)
    tenants = [f"honest-{k}" for k in range(honest)]
    _feed(cal, "clean", tenants, None, au, ratio)
    _feed(cal, "poisoned", tenants, "attacker", au, ratio)
    clean, poisoned = cal.estimate("clean"), cal.estimate("poisoned")
    assert clean is not None and clean.calibrated
    assert poisoned is not None and poisoned.calibrated  # before: None (slope <= 0) or 2-4x slower
    assert 0.85 < poisoned.prefill_tokens_per_s / clean.prefill_tokens_per_s < 1.18
    if honest % 2 == 0:  # odd count with the attacker: the median fit is an honest one
        assert abs(poisoned.overhead_s - clean.overhead_s) < 0.02
        assert abs(poisoned.queue_weight - clean.queue_weight) < 0.1


@pytest.mark.parametrize("au", [16, 1500, 4000])
@pytest.mark.parametrize("ratio", [1, 3])
def test_with_one_honest_tenant_the_attacker_moves_it_by_half_its_own_distortion(au: int, ratio: int) -> None:
    cal = Calibration(prior_rate=RATE)
    _feed(cal, "clean", ["honest"], None, au, ratio)
    _feed(cal, "poisoned", ["honest"], "attacker", au, ratio)
    clean, poisoned = cal.estimate("clean"), cal.estimate("poisoned")
    own = cal.estimator("poisoned", "attacker").estimate()
    assert clean is not None and poisoned is not None and poisoned.calibrated
    d = abs(math.log(own.prefill_tokens_per_s / clean.prefill_tokens_per_s)) if own is not None else 0.0
    assert abs(math.log(poisoned.prefill_tokens_per_s / clean.prefill_tokens_per_s)) <= d / 2 + 0.1


def test_one_tenant_alone_gets_exactly_the_single_fit() -> None:
    cal = Calibration(prior_rate=RATE)
    ref = PrefillRateEstimator(RATE)
    rng = random.Random(3)
    for _ in range(300):
        u, q = rng.randint(10, 3000), rng.randint(0, 5000)
        y = (u + 0.5 * q) / 7000 + 0.03 * rng.random()
        cal.observe_first_byte("a", u, q, y, q / 2, "only")
        ref.observe(u, q, y, q / 2)
    got, want = cal.estimate("a"), ref.estimate()
    assert got is not None and want is not None
    assert (got.prefill_tokens_per_s, got.queue_weight, got.overhead_s, got.samples) == (
        want.prefill_tokens_per_s, want.queue_weight, want.overhead_s, want.samples)


def test_a_fit_that_loses_its_slope_keeps_its_last_good_estimate() -> None:
    est = PrefillRateEstimator(RATE, min_samples=5)
    rng = random.Random(2)
    for _ in range(60):
        u, y = _honest(rng)
        est.observe(u, 0.0, y)
    good = est.estimate()
    assert good is not None and 0.8 < good.prefill_tokens_per_s / RATE < 1.25
    for k in range(200):  # time falls as work grows: no rate is identified (slope <= 0)
        est.observe(100 + 10 * k, 0.0, max(0.0, 2.0 - 0.01 * k))
    kept = est.estimate()
    assert kept is not None  # before: None, and every candidate of the pool fell back to the constant
    assert kept.prefill_tokens_per_s == good.prefill_tokens_per_s or kept.prefill_tokens_per_s > 0


def test_requests_with_unhashed_parts_do_not_feed_the_calibration() -> None:
    now = [0.0]
    cal = Calibration(prior_rate=100.0, min_samples=1)
    loads = CalibratingLoadTracker(InProcessLoadTracker(), cal, lambda: now[0])
    plain = RouteRequest("t", [b"k"], 100, 4, 16)
    tools = RouteRequest("t", [b"k"], 100, 4, 16, calibrate=False)  # before: no such field
    for req in (plain, tools, tools):
        t = loads.dispatch("a", req.prompt_tokens, req.max_tokens, 1, req.tenant_id, req.calibrate)
        now[0] += 5.0
        t.first_byte()
        t.finish()
    assert cal.observations("a") == 1
    assert loads.snapshot("a").running_requests == 0  # the unobserved tickets still give their load back


def test_the_router_passes_the_tenant_and_the_flag_to_the_ticket() -> None:
    from routing.index import InProcessPrefixIndex
    from routing.policies import build_policy
    from routing.router import Router

    now = [0.0]
    cal = Calibration(prior_rate=100.0, min_samples=1)
    loads = CalibratingLoadTracker(InProcessLoadTracker(), cal, lambda: now[0])
    router = Router(build_policy("cache_aware", {}), InProcessPrefixIndex(1000), loads, 16, cal)
    for tenant, calibrate in (("acme", True), ("globex", True), ("acme", False)):
        _, ticket = router.route(RouteRequest(tenant, [], 64, 4, 16, calibrate=calibrate), ["a"])
        now[0] += 1.0
        ticket.first_byte()
        ticket.finish()
    assert cal.estimator("a", "acme").samples == 1
    assert cal.estimator("a", "globex").samples == 1
    assert cal.observations("a") == 2


def test_fits_per_replica_are_bounded_and_stale_ones_dropped() -> None:
    from routing.calibration_tenants import ReplicaFits  # new in session 11

    fits = ReplicaFits(lambda: PrefillRateEstimator(RATE, min_samples=1), max_tenants=4, stale_after=50,
                       stale_after_s=0.0)
    rng = random.Random(4)
    for k in range(10):  # ten tenants, one after the other: never more than four fits
        for _ in range(3):
            u, y = _honest(rng)
            fits.observe(f"t{k}", u, 0.0, y, None)
        assert fits.tenants <= 4 and fits.ready <= 4
    for _ in range(60):  # one tenant only from now on: the others go stale and leave the median
        u, y = _honest(rng)
        fits.observe("steady", u, 0.0, y, None)
    assert fits.tenants == 1 and fits.ready == 1
    assert fits.median() == cal_params(fits.estimator("steady"))


def test_a_high_volume_tenant_does_not_push_quieter_fits_out() -> None:
    """Review R11b-2: 1,002 first bytes of one tenant within seconds used to drop every quieter tenant's fit
    (stale by observations alone) and make the replica's median its own; a fit now goes stale only when
    it was also not fed for ``stale_after_s`` seconds."""
    from routing.calibration_tenants import ReplicaFits

    now = [0.0]
    fits = ReplicaFits(lambda: PrefillRateEstimator(RATE, min_samples=20), clock=lambda: now[0])
    rng = random.Random(3)

    def feed(tenant: str, n: int, rate: float) -> None:
        for _ in range(n):
            u, q = rng.uniform(200, 4000), rng.uniform(0, 2000)
            fits.observe(tenant, u, q, 0.02 + (u + 0.5 * q) / rate * rng.uniform(0.95, 1.05), None)
            now[0] += 0.01

    for t in ("a", "b", "c", "d"):
        feed(t, 40, 8000.0)
    feed("mallory", 1040, 2000.0)  # ~10 s of one tenant's first bytes, 4x late
    assert fits.ready == 5
    rate = fits.median()
    assert rate is not None and 6000.0 < rate[0] < 11000.0
    now[0] += 601.0  # the quieter tenants away for ten minutes: their fits go, the liar's volume then rules
    feed("mallory", 5, 2000.0)
    assert fits.ready == 1


def cal_params(est: PrefillRateEstimator) -> tuple[float, float, float] | None:
    return est.params()


@pytest.mark.parametrize("au", [16, 4000])
def test_through_the_router_one_tenant_does_not_move_the_estimate(au: int) -> None:
    """The same poisoning through :class:`Router` and the calibrating tracker, with the API of both
    trees (fails on the old tree by its result: one pooled fit per replica)."""
    from routing.index import InProcessPrefixIndex
    from routing.policies import build_policy
    from routing.router import Router

    def run(attacker: bool) -> float:
        now = [0.0]
        cal = Calibration(prior_rate=RATE)
        loads = CalibratingLoadTracker(InProcessLoadTracker(), cal, lambda: now[0])
        router = Router(build_policy("cache_aware", {}), InProcessPrefixIndex(1000), loads, 16, cal)
        rng = random.Random(5)
        for i in range(400):
            u, y = _honest(rng)
            sends = [(f"honest-{i % 3}", u, y)] + ([("attacker", au, 0.8)] if attacker else [])
            for tenant, tokens, ttft in sends:
                _, ticket = router.route(RouteRequest(tenant, [], tokens, 4, 16), ["a"])
                now[0] += ttft
                ticket.first_byte()
                ticket.finish()
        e = cal.estimate("a")
        assert e is not None and e.calibrated  # before: None for u=16 (the slope lost)
        return e.prefill_tokens_per_s

    assert 0.85 < run(True) / run(False) < 1.18  # before: 2x slower (u=4000)
