from __future__ import annotations

import pytest

from routing.index import InProcessPrefixIndex
from routing.load import InProcessLoadTracker
from routing.policies import NoCandidateError, RouteRequest, build_policy
from routing.router import Router
from tenancy.prefix import block_hash_chain

KEY = b"k" * 32


def make_router(policy: str = "cache_aware") -> Router:
    return Router(build_policy(policy, {}), InProcessPrefixIndex(1000), InProcessLoadTracker(), 4)


def rr(tokens: list[int], key_id: str = "v1", max_tokens: int = 5) -> RouteRequest:
    return RouteRequest("t", block_hash_chain(KEY, tokens, 4, key_id=key_id), len(tokens), max_tokens, 4)


def test_route_records_dispatches_and_counts() -> None:
    router = make_router()
    ids = ["a", "b", "c"]
    first = rr(list(range(12)))
    c1, t1 = router.route(first, ids)
    assert c1.predicted_prefix_tokens == 0
    assert router.loads.snapshot(c1.replica_id).queued_prefill_tokens == 12
    assert router.loads.snapshot(c1.replica_id).decode_tokens == 5
    t1.first_byte()
    t1.finish()
    # Next turn of the same conversation goes to the same replica with 12 predicted tokens.
    second = rr(list(range(12)) + [50, 51, 52, 53, 54])
    c2, t2 = router.route(second, ids)
    assert c2.replica_id == c1.replica_id
    assert c2.predicted_prefix_tokens == 12 and c2.available_prefix_tokens == 12
    assert router.loads.snapshot(c2.replica_id).queued_prefill_tokens == 17 - 12
    router.observe_delivered(c1, 0)
    router.observe_delivered(c2, 8)  # replica evicted a block: index was stale
    c = router.counters()
    assert (c.requests, c.prompt_tokens, c.available_prefix_tokens, c.predicted_prefix_tokens) == (2, 29, 12, 12)
    assert (c.observed_requests, c.delivered_prefix_tokens, c.underdelivered_tokens, c.overdelivered_tokens) == (
        2,
        8,
        4,
        0,
    )
    t2.finish()


def test_previous_key_version_matches_but_records_current() -> None:
    router = make_router()
    tokens = list(range(16))
    old = rr(tokens, key_id="v1")
    c_old, _ = router.route(old, ["a", "b"])
    new = rr(tokens, key_id="v2")
    c_new, _ = router.route(new, ["a", "b"], alt_key_chains=[old.block_keys])
    assert c_new.replica_id == c_old.replica_id
    assert c_new.predicted_prefix_tokens == 16
    assert router.index.match(c_new.replica_id, new.block_keys) == 4  # current version recorded


def test_no_candidates_and_forget() -> None:
    router = make_router("least_load")
    with pytest.raises(NoCandidateError):
        router.route(rr([1, 2, 3, 4]), [])
    c, _ = router.route(rr([1, 2, 3, 4]), ["a"])
    router.forget_replica("a")
    assert router.index.match("a", rr([1, 2, 3, 4]).block_keys) == 0
