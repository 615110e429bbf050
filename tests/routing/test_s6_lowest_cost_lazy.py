"""Session 6 (issue 14): LowestCostPicker computes the rendezvous tie-break only among the
candidates tied on (score, matched blocks); its picks equal the full-key ``min`` of before."""

from __future__ import annotations

import math
import random

import routing.pickers.lowest_cost as lowest_cost
from routing.hashing import request_point, tiebreak
from routing.pickers.lowest_cost import LowestCostPicker
from routing.types import Candidate, ReplicaLoad, RouteRequest


def _reference(req, eligible, scores, skip_blocks):
    """The pick of session 5: one min over the full key."""
    if len(eligible) == 1:
        return eligible[0]
    point = request_point(req, skip_blocks)
    return min(eligible, key=lambda c: (scores[c.replica_id], -c.matched_blocks, tiebreak(point, c.replica_id),
                                        c.replica_id))


def _case(rng: random.Random):
    n = rng.randint(1, 6)
    ids = rng.sample([f"r{i}" for i in range(10)], n)
    keys = [bytes([rng.randrange(256)]) * 16 for _ in range(rng.randint(0, 4))]
    req = RouteRequest(tenant_id=rng.choice(["a", "b"]), block_keys=keys, prompt_tokens=64, max_tokens=8,
                       block_size=16)
    pool = [0.0, 1.0, 1.0, 2.5, math.inf] + ([math.nan] if rng.random() < 0.2 else [])
    cands = [Candidate(rid, ReplicaLoad(rid), matched_blocks=rng.choice([0, 0, 1, 2])) for rid in ids]
    scores = {c.replica_id: rng.choice(pool) for c in cands}
    eligible = [c for c in cands if rng.random() < 0.8] or cands[:1]
    return req, cands, eligible, scores


def test_picks_equal_the_full_key_min() -> None:
    rng = random.Random(14)
    for skip in (0, 1, 2):
        picker = LowestCostPicker(skip_blocks=skip)
        for _ in range(4000):
            req, cands, eligible, scores = _case(rng)
            got = picker.pick(req, cands, eligible, scores).candidate
            assert got is _reference(req, eligible, scores, skip)


def test_no_tie_breaks_computed_without_a_tie(monkeypatch) -> None:
    calls = []

    def counting(point, rid):
        calls.append(rid)
        return tiebreak(point, rid)

    monkeypatch.setattr(lowest_cost, "tiebreak", counting)
    req = RouteRequest(tenant_id="a", block_keys=[b"k" * 16], prompt_tokens=32, max_tokens=8, block_size=16)
    cands = [Candidate(rid, ReplicaLoad(rid)) for rid in ("r0", "r1", "r2")]
    pick = LowestCostPicker().pick(req, cands, cands, {"r0": 3.0, "r1": 1.0, "r2": 2.0})
    assert pick.candidate.replica_id == "r1" and calls == []
    # a tie on cost and matched blocks: only the tied ones are hashed
    pick = LowestCostPicker().pick(req, cands, cands, {"r0": 1.0, "r1": 1.0, "r2": 2.0})
    assert sorted(calls) == ["r0", "r1"]
    assert pick.candidate is _reference(req, cands, {"r0": 1.0, "r1": 1.0, "r2": 2.0}, 1)
