"""Session 9: the opt-in queue-externality term of ``cache_aware``
(:mod:`routing.scorers.queue_externality`)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from routing.calibration import ReplicaEstimate
from routing.policies import build_policy
from routing.policies.cache_aware import CacheAwareConfig, CacheAwarePolicy
from routing.scheduler import Scheduler
from routing.scorers.queue_externality import QueueExternalityScorer, externality_cost
from routing.types import Candidate, ReplicaLoad, RouteRequest
from tests.routing.test_s6_route_cost import _case


def _two(req_prompt: int) -> tuple[RouteRequest, list[Candidate]]:
    """a: 1000 queued tokens in 5 requests (4 waiting behind the one prefilling); b: 1200 queued
    tokens in 1 request (nobody waiting)."""
    req = RouteRequest("t", (), req_prompt, 8, 16)
    return req, [Candidate("a", ReplicaLoad("a", 1000, 0, 5, 5)), Candidate("b", ReplicaLoad("b", 1200, 0, 1, 1))]


def test_default_chain_has_no_externality_term() -> None:
    """Weight 0 (default): three scorers, as before session 9 (decisions unchanged)."""
    assert [s.name for s in CacheAwarePolicy().scorers] == ["estimated_ttft", "decode_load", "prefix_affinity"]
    assert CacheAwarePolicy(queue_externality_weight=1.0).scorers[-1].name == "queue_externality"


def test_a_long_prompt_avoids_the_queue_of_many_a_short_one_joins_it() -> None:
    """Without the term both go to a (200 tokens less queued). With weight 1, 800 uncached tokens
    would delay a's 4 waiting requests (3200 tokens of delay): b; 10 tokens delay them by 40: a."""
    for prompt in (800, 10):
        req, cands = _two(prompt)
        assert CacheAwarePolicy(calibrate=False).choose(req, cands).replica_id == "a"
    pol = CacheAwarePolicy(calibrate=False, queue_externality_weight=1.0)
    assert pol.choose(*_two(800)).replica_id == "b"
    assert pol.choose(*_two(10)).replica_id == "a"


def test_nobody_waits_behind_on_a_shared_replica() -> None:
    """Queue weight 0 (learnt on a replica whose prefills share the rate): no term."""
    est = ReplicaEstimate(1000.0, 0.0, 0.0, 50)
    req = RouteRequest("t", (), 800, 8, 16)
    cands = [Candidate("a", ReplicaLoad("a", 1000, 0, 5, 5), 0, est)]
    assert QueueExternalityScorer(1.0, 1000.0, calibrated=True).score(req, cands) == {"a": 0.0}
    assert externality_cost(1.0, 1.0, 5, 800, 1000.0) == pytest.approx(3.2)
    assert externality_cost(1.0, 1.0, 0, 800, 1000.0) == 0.0  # nothing in flight: nobody behind


def test_negative_weight_is_refused() -> None:
    with pytest.raises(ValidationError):
        CacheAwareConfig(queue_externality_weight=-1.0)
    with pytest.raises(ValueError):
        QueueExternalityScorer(-1.0, 1000.0)
    assert build_policy("cache_aware", {"queue_externality_weight": 0.5}).config.queue_externality_weight == 0.5


@settings(max_examples=300, deadline=None)
@given(_case(), st.booleans(), st.floats(0.0, 64.0), st.floats(0.01, 4.0), st.floats(1.0, 1e6))
def test_fused_costs_with_the_term_equal_the_generic_sum(case: tuple[RouteRequest, list[Candidate]],
                                                         calibrate: bool, prefix_w: float, ext_w: float,
                                                         rate: float) -> None:
    """The one-pass cost of ``cache_aware`` adds the term exactly as the generic chain does."""
    req, cands = case
    pol = CacheAwarePolicy(calibrate=calibrate, prefix_weight=prefix_w, queue_externality_weight=ext_w,
                           prefill_tokens_per_s=rate)
    fused = pol._costs(req, cands)
    generic = Scheduler._costs(pol, req, cands)
    assert list(fused) == list(generic)
    for rid in generic:
        assert fused[rid] == generic[rid] or (math.isnan(fused[rid]) and math.isnan(generic[rid]))
