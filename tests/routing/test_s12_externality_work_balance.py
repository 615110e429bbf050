"""Session 12: the queue-externality term counts a replica's waiting requests at least as its share
of the queued work (``cache_aware``'s opt-in ``queue_externality_work_balance``,
:func:`routing.scorers.queue_externality.work_equivalent_requests`).

The hole: with ``queue_externality_weight`` 0.5 (session 9) one replica of six took 93 of 2000
requests (116 with session 11's ``dispatch_share_reserve_next_turn``) at a quarter of the prefill speed (fifo, tests/routing/test_s2_routing_robustness.py's
setting): it held few but long prompts, so every further long prompt found it cheapest (few
waiting there) while its queued work grew past the others'. The request count looked starved;
the work was not (prefill busy max/mean ~1.5)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routing.calibration import Calibration
from routing.policies import build_policy
from routing.policies.cache_aware import CacheAwareConfig, CacheAwarePolicy
from routing.scheduler import Scheduler
from routing.scorers.queue_externality import QueueExternalityScorer, work_equivalent_requests
from routing.types import Candidate, ReplicaLoad, RouteRequest
from sim import des
from tests.routing.test_s6_route_cost import _case

#: the candidate session 12 proposes (docs/routing.md, "Session 12"); off by default
CANDIDATE = {"queue_externality_weight": 1.0, "dispatch_share_reserve_next_turn": True,
             "queue_externality_work_balance": True}
#: session 11's candidate, the one that left a replica with 116 of 2000 requests
SESSION_11 = {"queue_externality_weight": 0.5, "dispatch_share_reserve_next_turn": True}


def _three() -> list[Candidate]:
    """long: 3 requests holding 9000 queued tokens; short: 9 holding 900; idle: nothing queued."""
    return [Candidate("long", ReplicaLoad("long", 9000, 0, 3, 3)),
            Candidate("short", ReplicaLoad("short", 900, 0, 9, 9)),
            Candidate("idle", ReplicaLoad("idle", 0, 0, 0, 0))]


def test_a_replica_of_few_long_prompts_is_counted_by_its_work() -> None:
    k = work_equivalent_requests(_three())
    # means: 4 requests and 3300 tokens per replica
    assert k["long"] == pytest.approx(4 * 9000 / 3300)  # 10.9 > its 3 requests
    assert k["short"] == 9.0  # its count is the larger
    assert k["idle"] == 0.0
    assert work_equivalent_requests([Candidate("a", ReplicaLoad("a", 0, 0, 2, 2))]) == {"a": 2.0}
    assert work_equivalent_requests([]) == {}


def test_a_long_prompt_no_longer_prefers_the_replica_with_the_most_work() -> None:
    req = RouteRequest("t", (), 4000, 8, 16)
    cands = _three()[:2]
    plain = QueueExternalityScorer(1.0, 1000.0).score(req, cands)
    balanced = QueueExternalityScorer(1.0, 1000.0, work_balance=True).score(req, cands)
    assert plain["long"] < plain["short"]  # 2 waiting against 8: the work-heavy replica looked cheap
    assert balanced["long"] > balanced["short"] == plain["short"]  # counted by its work, it is the dearer


def test_off_by_default_and_plumbed() -> None:
    assert CacheAwareConfig().queue_externality_work_balance is False
    assert len(CacheAwarePolicy(queue_externality_work_balance=True).scorers) == 3  # weight 0: no term
    pol = build_policy("cache_aware", CANDIDATE)
    assert pol.scorers[-1].name == "queue_externality" and pol.scorers[-1].work_balance is True


@settings(max_examples=200, deadline=None)
@given(_case(), st.booleans(), st.floats(0.01, 4.0))
def test_fused_costs_with_work_balance_equal_the_generic_sum(case: tuple[RouteRequest, list[Candidate]],
                                                             calibrate: bool, ext_w: float) -> None:
    req, cands = case
    pol = CacheAwarePolicy(calibrate=calibrate, queue_externality_weight=ext_w, queue_externality_work_balance=True)
    fused = pol._costs(req, cands)
    generic = Scheduler._costs(pol, req, cands)
    assert list(fused) == list(generic)
    for rid in generic:
        assert fused[rid] == generic[rid] or (math.isnan(fused[rid]) and math.isnan(generic[rid]))


def _fifo_quarter_speed(params: dict[str, object]) -> tuple[Counter[str], des.PolicyResult, Calibration]:
    """test_s2_routing_robustness's fifo x0.25 run (2000 rows, six replicas) with ``params``."""
    pol = build_policy("cache_aware", params)
    counts: Counter[str] = Counter()
    choose = pol.choose

    def counting(req, cands):  # type: ignore[no-untyped-def]
        choice = choose(req, cands)
        counts[choice.replica_id] += 1
        return choice

    pol.choose = counting  # type: ignore[method-assign]
    cal = Calibration(prior_rate=10000.0)
    res = des.simulate("x", pol, des.load_trace(rows=2000), des.SimConfig(prefill_tokens_per_s=2500.0), cal)
    return counts, res, cal


@pytest.mark.parametrize("params", [{"queue_externality_weight": 0.5}, SESSION_11], ids=["weight", "s11"])
def test_the_externality_alone_leaves_a_replica_under_used_and_over_worked(params: dict[str, object]) -> None:
    """The hole (deterministic): the replica with the fewest requests has the most prefill work."""
    counts, res, _ = _fifo_quarter_speed(params)
    assert min(counts.values()) < 250
    assert res.prefill_imbalance > 1.3


def test_work_balance_keeps_every_replica_in_use_and_the_work_even() -> None:
    counts, res, cal = _fifo_quarter_speed(CANDIDATE)
    assert sum(counts.values()) == 2000 and len(counts) == 6
    assert min(counts.values()) >= 250, counts  # test_s2's calibration needs >= 250 first bytes each
    assert res.prefill_imbalance < 1.2  # 1.11 (1.50 with session 11's candidate, 1.03 the defaults)
    for i in range(6):
        est = cal.estimate(f"r{i}")
        assert est is not None and est.calibrated and est.samples >= 250


def test_des_grid_runs_the_candidate_by_name() -> None:
    from sim.des_grid import ALL_RULES, KNOWN_RULES, WORK_BALANCE_RULES

    assert not set(WORK_BALANCE_RULES) & set(ALL_RULES)  # session 11's rule set is unchanged
    cfg = KNOWN_RULES["rsv_wb_ext1"]("fifo").config
    assert {k: getattr(cfg, k) for k in CANDIDATE} == CANDIDATE
