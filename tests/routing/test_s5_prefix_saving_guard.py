"""Issue 15 (session 5): the load guard credits a prefix holder with the work its prefix saves.

Bounded loads (Mirrokni, Thorup, Zadimoghaddam 2018) treat every request as
one unit of load. A request whose history is cached on a replica brings that
replica only the uncached part of its work; moving it elsewhere adds the
saved tokens to the cluster's work (and evicts other conversations' blocks to
hold the duplicate). So in ``cache_aware``'s guard
(routing/filters/load_guard.py, ``prefix_credit=lambda c: True``), for a candidate whose
prefix saves ``saved`` tokens over the least-matching candidate (fraction
``f = saved / (prompt + max_tokens)`` of the request's work):

* the request bound's deviation from the mean is scaled by ``1 / (1 - f)``:
  ``running + 1 <= ceil((1 + (factor - 1) / (1 - f)) * mean)``;
* its token load after the request is counted without ``saved``.

A candidate that saves nothing (``f = 0``) is held to the bound as before.
"""

from __future__ import annotations

import math

from routing import Candidate, ReplicaLoad, RouteRequest, build_policy
from routing.filters.load_guard import LoadGuardFilter


def _req(blocks: int, max_tokens: int = 0) -> RouteRequest:
    keys = tuple(bytes([i + 1]) * 16 for i in range(blocks))
    return RouteRequest("t0", keys, blocks * 16, max_tokens, 16)


def _cand(rid: str, matched: int = 0, running: int = 0, queued: int = 0, decode: int = 0) -> Candidate:
    return Candidate(rid, ReplicaLoad(rid, queued_prefill_tokens=queued, decode_tokens=decode,
                                      running_requests=running), matched)


def _ids(cands: list[Candidate]) -> list[str]:
    return [c.replica_id for c in cands]


def test_holder_at_the_request_bound_is_kept_when_its_prefix_saves_most_of_the_work() -> None:
    # 3 candidates, 2 + 0 + 0 running, +1 = 3 -> mean 1, cap ceil(2 * 1) = 2: "a" (2 running) is over
    req = _req(10)
    cands = [_cand("a", matched=9, running=2), _cand("b", matched=1), _cand("c", matched=1)]
    plain = LoadGuardFilter(request_factor=2.0)
    assert _ids(plain.filter(req, cands)) == ["b", "c"]
    # saved = 8 of 10 blocks: f = 0.8, factor 1 + 1 / 0.2 = 6, cap ceil(6 * 1) = 6
    saving = LoadGuardFilter(request_factor=2.0, prefix_credit=lambda c: True)
    assert _ids(saving.filter(req, cands)) == ["a", "b", "c"]


def test_candidates_that_save_nothing_are_held_to_the_bound_as_before() -> None:
    req = _req(10)
    # everybody matches alike: no candidate saves anything over another
    cands = [_cand("a", matched=1, running=2), _cand("b", matched=1), _cand("c", matched=1)]
    saving = LoadGuardFilter(request_factor=2.0, prefix_credit=lambda c: True)
    assert _ids(saving.filter(req, cands)) == ["b", "c"]


def test_deviation_scales_with_the_fraction_saved() -> None:
    # mean (3 + 0 + 0 + 1) / 3 = 4/3; plain cap ceil(2 * 4/3) = 3, "a" at 3 would make 4
    cands_small = [_cand("a", matched=2, running=3), _cand("b", matched=1), _cand("c", matched=1)]
    cands_large = [_cand("a", matched=10, running=3), _cand("b", matched=1), _cand("c", matched=1)]
    req = _req(12)
    saving = LoadGuardFilter(request_factor=2.0, prefix_credit=lambda c: True)
    # f = 1/12: factor 1 + 1 / (11/12) = 2.09, cap ceil(2.79) = 3 -> still over
    assert math.ceil((1 + 1 / (11 / 12)) * 4 / 3) == 3
    assert _ids(saving.filter(req, cands_small)) == ["b", "c"]
    # f = 9/12: factor 5, cap ceil(6.67) = 7 -> kept
    assert _ids(saving.filter(req, cands_large)) == ["a", "b", "c"]


def test_token_bound_counts_a_holder_without_the_tokens_its_prefix_saves() -> None:
    req = _req(20)  # 320 tokens, unit 320
    # a holds 19 blocks (saves 18 * 16 = 288 tokens over b and c)
    cands = [_cand("a", matched=19, queued=1200), _cand("b", matched=1), _cand("c", matched=1)]
    plain = LoadGuardFilter(request_factor=100.0, token_factor=1.0)
    saving = LoadGuardFilter(request_factor=100.0, token_factor=1.0, prefix_credit=lambda c: True)
    # mean = (1200 + 0 + 0 + 16) / 3 = 405.3 -> cap ceil(405.3 / 320) * 320 = 640;
    # a after = 1200 + 16 = 1216 > 640 either way (the credit is 288, not a blanket exemption)
    assert _ids(plain.filter(req, cands)) == ["b", "c"]
    assert _ids(saving.filter(req, cands)) == ["b", "c"]
    cands = [_cand("a", matched=19, queued=900), _cand("b", matched=1, queued=300), _cand("c", matched=1)]
    # mean = (900 + 300 + 16) / 3 = 405.3 -> cap 640; a after 916 > 640, minus 288 = 628 <= 640
    assert _ids(plain.filter(req, cands)) == ["b", "c"]
    assert _ids(saving.filter(req, cands)) == ["a", "b", "c"]


def test_cache_aware_credits_a_holder_only_within_its_dispatch_share() -> None:
    req = _req(10)
    cands = [_cand("a", matched=9, running=2), _cand("b", matched=1), _cand("c", matched=1)]
    params = {"calibrate": False, "slack_requests": 0}
    pol = build_policy("cache_aware", params)
    assert pol.choose(req, cands).replica_id == "a"  # empty window: a is within its share
    # a took 8 of the last 10 dispatches: cap ceil(1.2 * 11 / 3) = 5, a's 8 + 1 is over; still a
    # prefix holder (the dispatch-share guard keeps it) but the load guard gives it no credit
    pol = build_policy("cache_aware", params)
    for rid in ["a"] * 8 + ["b", "c"]:
        pol.dispatch_share.record(rid)
    choice = pol.choose(req, cands)
    assert choice.replica_id != "a" and choice.reason == "load_guard"
    # without the dispatch-share guard there is no share bound, so no credit either
    pol = build_policy("cache_aware", {**params, "dispatch_share_factor": None})
    assert pol.choose(req, cands).replica_id != "a"


def test_consistent_hash_guard_is_unchanged() -> None:
    req = _req(10)
    cands = [_cand("a", matched=9, running=2), _cand("b", matched=1), _cand("c", matched=1)]
    assert build_policy("consistent_hash", {}).choose(req, cands).replica_id != "a"
