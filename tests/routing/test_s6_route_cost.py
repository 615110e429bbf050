"""Issue 14 (session 6): the routing path's per-request cuts keep every decision identical.

* ``cache_aware`` sums its three scorers in one pass (:meth:`CacheAwarePolicy._costs`): the
  very same floats as the generic :meth:`Scheduler._costs` (property test, exact equality);
* the load guard of one candidate (:meth:`LoadGuardFilter._one`) keeps what the general
  filter keeps (property test against the pre-session-6 filter, copied here);
* the pickers skip the rendezvous hash when one candidate is eligible (same pick);
* the load tracker hands out the same immutable snapshot until a counter changes, and the
  calibration the same estimate until its estimator, engine sample or external load changes:
  both must show every change at once.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from routing.calibration import CalibratingLoadTracker, Calibration, EngineSample, ReplicaEstimate
from routing.filters.load_guard import LoadGuardFilter
from routing.hashing import prefix_tokens
from routing.load import InProcessLoadTracker
from routing.pickers.least_load import LeastLoadPicker
from routing.pickers.lowest_cost import LowestCostPicker
from routing.policies.cache_aware import CacheAwarePolicy
from routing.scheduler import Scheduler
from routing.scorers._rates import rates_and_queue_weights
from routing.types import Candidate, ReplicaLoad, RouteRequest


def _reference_guard(g: LoadGuardFilter, req: RouteRequest, candidates: Sequence[Candidate]) -> list[Candidate]:
    """LoadGuardFilter.filter as it was before session 6 (dicts per id, for any n)."""
    n = len(candidates)
    uncached = {c.replica_id: req.prompt_tokens - prefix_tokens(req, c.matched_blocks) for c in candidates}
    unit = max(1, req.prompt_tokens + req.max_tokens)
    worst = max(uncached.values())
    credit = g.prefix_credit
    saved = {c.replica_id: worst - uncached[c.replica_id] if credit is not None and credit(c) else 0
             for c in candidates}
    running = {c.replica_id: c.load.running_requests + g._external(c) for c in candidates}
    mean_req = (sum(running.values()) + 1) / n
    keep = [c for c in candidates
            if running[c.replica_id] + 1 <= g._request_cap(saved[c.replica_id] / unit, mean_req)]
    if g.token_factor is None or not keep:
        return keep
    load = g._token_loads(candidates, uncached)
    cost = min(uncached.values()) + req.max_tokens
    mean = (sum(load.values()) + cost) / n
    tok_cap = math.ceil(g.token_factor * mean / unit) * unit
    tok_cap += g.slack_requests * unit + g.token_slack
    return [c for c in keep
            if load[c.replica_id] + uncached[c.replica_id] + req.max_tokens - saved[c.replica_id] <= tok_cap]


_est = st.one_of(st.none(), st.builds(
    ReplicaEstimate, st.floats(1.0, 1e6), st.floats(0.0, 1.0), st.floats(0.0, 1.0), st.integers(0, 100),
    st.none(), st.booleans(), st.floats(0.0, 50.0)))


@st.composite
def _case(draw: st.DrawFn, max_n: int = 6) -> tuple[RouteRequest, list[Candidate]]:
    blocks = draw(st.integers(0, 12))
    block_size = draw(st.sampled_from([1, 16, 64]))
    prompt = draw(st.integers(0, blocks * block_size + block_size))
    req = RouteRequest("t", tuple(bytes([i]) * 8 for i in range(blocks)), prompt, draw(st.integers(0, 4096)),
                       block_size, draw(st.integers(1, 4)))
    n = draw(st.integers(1, max_n))
    cands = []
    for i in range(n):
        load = ReplicaLoad(f"r{i}", draw(st.integers(0, 200_000)), draw(st.integers(0, 200_000)),
                           draw(st.integers(0, 300)), draw(st.integers(0, 300)))
        cands.append(Candidate(f"r{i}", load, draw(st.integers(0, blocks + 2)), draw(_est)))
    return req, cands


@settings(max_examples=400, deadline=None)
@given(_case(), st.booleans(), st.floats(0.0, 64.0), st.floats(0.0, 4.0), st.floats(1.0, 1e6))
def test_fused_costs_equal_the_generic_sum_bit_for_bit(case: tuple[RouteRequest, list[Candidate]],
                                                       calibrate: bool, prefix_w: float, decode_w: float,
                                                       rate: float) -> None:
    req, cands = case
    pol = CacheAwarePolicy(calibrate=calibrate, prefix_weight=prefix_w, decode_weight=decode_w,
                           prefill_tokens_per_s=rate)
    fused = pol._costs(req, cands)
    generic = Scheduler._costs(pol, req, cands)
    assert list(fused) == list(generic)
    for rid in generic:  # exact: the same operations in the same order
        assert fused[rid] == generic[rid] or (math.isnan(fused[rid]) and math.isnan(generic[rid]))


def test_fused_costs_step_aside_when_a_scorer_is_replaced() -> None:
    pol = CacheAwarePolicy()
    req = RouteRequest("t", (b"a" * 8,), 32, 8, 16)
    cands = [Candidate("a", ReplicaLoad("a", 100, 50, 1, 1), 1), Candidate("b", ReplicaLoad("b"), 0)]

    class Flat:
        name = "flat"

        def score(self, req: RouteRequest, candidates: Sequence[Candidate]) -> dict[str, float]:
            return {c.replica_id: 7.0 for c in candidates}

    pol.scorers = (Flat(),)
    assert pol._costs(req, cands) == {"a": 7.0, "b": 7.0}


@settings(max_examples=400, deadline=None)
@given(_case(max_n=1), st.floats(1.0, 4.0), st.one_of(st.none(), st.floats(1.0, 4.0)), st.floats(0.0, 8.0),
       st.floats(0.0, 5000.0), st.booleans(), st.booleans())
def test_one_candidate_guard_keeps_what_the_general_filter_keeps(case: tuple[RouteRequest, list[Candidate]],
                                                                 rf: float, tf: float | None, slack: float,
                                                                 tslack: float, calibrated: bool,
                                                                 credit: bool) -> None:
    req, cands = case
    g = LoadGuardFilter(rf, tf, slack, tslack, calibrated, (lambda c: True) if credit else None)
    assert g.filter(req, cands) == _reference_guard(g, req, cands)


@settings(max_examples=200, deadline=None)
@given(_case())
def test_pickers_pick_the_same_with_one_or_many_eligible(case: tuple[RouteRequest, list[Candidate]]) -> None:
    req, cands = case
    scores = {c.replica_id: float(i % 3) for i, c in enumerate(cands)}
    for eligible in ([cands[-1]], cands):
        low = LowestCostPicker(1).pick(req, cands, eligible, scores)
        least = LeastLoadPicker(0).pick(req, cands, eligible, scores)
        if len(eligible) == 1:
            assert low.candidate is eligible[0] and least.candidate is eligible[0]
        best = max(c.matched_blocks for c in cands)
        if low.candidate.matched_blocks == best and best > 0:
            assert low.reason == "best_prefix"
        assert least.reason == "min_token_load"


def test_load_snapshot_is_reused_until_a_counter_changes() -> None:
    loads = InProcessLoadTracker()
    assert loads.snapshot("a") == ReplicaLoad("a")
    t = loads.dispatch("a", 100, 10)
    s1 = loads.snapshot("a")
    assert loads.snapshot("a") is s1  # nothing changed: no rebuild
    assert (s1.queued_prefill_tokens, s1.decode_tokens, s1.running_requests, s1.prefilling_requests) == (100, 10, 1, 1)
    t.first_byte()
    s2 = loads.snapshot("a")
    assert (s2.queued_prefill_tokens, s2.running_requests, s2.prefilling_requests) == (0, 1, 0)
    t2 = loads.dispatch("a", 5, 1)
    assert loads.snapshot("a").queued_prefill_tokens == 5 and loads.snapshot("a").running_requests == 2
    t.finish()
    t2.finish()
    assert loads.snapshot("a") == ReplicaLoad("a") and s1.queued_prefill_tokens == 100  # old ones untouched
    loads.release("a", 0, 0, 0)
    assert loads.snapshot("a") == ReplicaLoad("a")


def test_calibrated_estimate_is_reused_until_its_inputs_change() -> None:
    cal = Calibration(prior_rate=1000.0, min_samples=2)
    assert cal.estimate("a") is None
    cal.observe_engine("a", EngineSample(running=1.0, waiting=0.0), own_requests=0)
    e1 = cal.estimate("a")
    assert e1 is not None and not e1.calibrated and e1.external_requests == 1.0
    assert cal.estimate("a") is e1
    cal.observe_engine("a", EngineSample(running=3.0, waiting=1.0), own_requests=1)  # new sample and external
    e2 = cal.estimate("a")
    assert e2 is not e1 and e2.external_requests == 3.0 and e2.engine == EngineSample(running=3.0, waiting=1.0)
    cal.defer_observations(True)
    for i in range(3):
        cal.observe_first_byte("a", 1000.0 * (i + 1), 0.0, 1.0 * (i + 1))
    e3 = cal.estimate("a")  # the deferred samples are applied first
    assert e3 is not None and e3.calibrated and e3.samples == 3
    cal.observe_first_byte("a", 500.0, 0.0, 0.5)
    assert cal.estimate("a").samples == 4  # type: ignore[union-attr]
    cal.observe_first_byte("a", math.inf, 0.0, 0.5)  # ignored: no new sample, same estimate
    e4 = cal.estimate("a")
    assert cal.estimate("a") is e4 and e4.samples == 4  # type: ignore[union-attr]
    cal.forget_replica("a")
    assert cal.estimate("a") is None


def test_calibrating_tracker_snapshots_follow_the_inner_tracker() -> None:
    inner = InProcessLoadTracker()
    tracker = CalibratingLoadTracker(inner, Calibration(), time.monotonic)
    t = tracker.dispatch("a", 40, 2)
    assert tracker.snapshot("a") is inner.snapshot("a") and tracker.snapshot("a").queued_prefill_tokens == 40
    t.finish()
    assert tracker.snapshot("a") == ReplicaLoad("a")


def test_rates_helper_unchanged_for_partly_calibrated_sets() -> None:
    est = ReplicaEstimate(500.0, 0.5, 0.0, 30)
    cands = [Candidate("a", ReplicaLoad("a"), 0, est), Candidate("b", ReplicaLoad("b"), 0, None)]
    assert rates_and_queue_weights(cands, 100.0, True) == {"a": (100.0, 1.0), "b": (100.0, 1.0)}


def _general_solve(m: list[list[float]], v: list[float]) -> list[float] | None:
    """The n x n elimination routing/calibration.py used before session 6 (partial pivoting, the
    first row of largest magnitude; ``None`` when a pivot is below 1e-12): the reference."""
    n = len(v)
    a = [row[:] + [v[i]] for i, row in enumerate(m)]
    for col in range(n):
        piv, best = col, abs(a[col][col])
        for r in range(col + 1, n):
            x = abs(a[r][col])
            if x > best:
                piv, best = r, x
        if best < 1e-12:
            return None
        a[col], a[piv] = a[piv], a[col]
        ac = a[col]
        d = ac[col]
        for r in range(n):
            if r != col:
                ar = a[r]
                f = ar[col] / d
                for k in range(col, n + 1):
                    ar[k] -= f * ac[k]
    return [a[i][n] / a[i][i] for i in range(n)]


_entry = st.one_of(st.just(0.0), st.floats(-1e6, 1e6), st.floats(-1e-11, 1e-11), st.floats(-1.0, 1.0))


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.lists(_entry, min_size=3, max_size=3), min_size=3, max_size=3),
       st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=3))
def test_unrolled_3x3_solve_is_the_general_solve_bit_for_bit(m: list[list[float]], v: list[float]) -> None:
    from routing.linsolve import solve3

    assert repr(solve3(m, v)) == repr(_general_solve(m, v))  # repr: NaN and -0.0 compare too
