"""Issue 17: the locality rule's wait ratio (``flow.locality_wait_ratio``, gateway/flow_room.py ``warmth``).

A request whose prefix replica is full waits for it while the prefill that replica must drain
first is at most ``ratio`` x the prefix; beyond that it goes cold (recomputes the prefix on a
replica with room)."""

from __future__ import annotations

from gateway.config_flow import FlowConfig
from gateway.flow_room import warmth as _warmth
from routing.types import Candidate, ReplicaLoad

BS = 16


def _cands(warm_queued: int) -> list[Candidate]:
    return [Candidate("warm", ReplicaLoad("warm", queued_prefill_tokens=warm_queued), matched_blocks=20),
            Candidate("cold", ReplicaLoad("cold"), matched_blocks=0)]


def test_ratio_one_is_the_first_sessions_rule() -> None:
    # prefix 320 tokens, uncached 80, bound 500: the drain is queued + 80 - 500
    assert _warmth(_cands(600), {"cold"}, BS, 400, 500, wait_ratio=1.0) is None  # drain 180 <= 320: wait
    assert _warmth(_cands(900), {"cold"}, BS, 400, 500, wait_ratio=1.0) == "cold"  # drain 480 > 320: cold


def test_the_default_ratio_is_four() -> None:
    # measured on the Mooncake replay (bench.fairness_replay): hit rate 0.98x instead of 0.89x
    assert FlowConfig().locality_wait_ratio == 4.0


def test_a_larger_ratio_waits_longer_for_the_prefix() -> None:
    assert _warmth(_cands(900), {"cold"}, BS, 400, 500, wait_ratio=4.0) is None  # 480 <= 4 x 320
    assert _warmth(_cands(1800), {"cold"}, BS, 400, 500, wait_ratio=4.0) == "cold"  # 1380 > 1280
    assert _warmth(_cands(900), {"warm", "cold"}, BS, 400, 500, wait_ratio=0.0) == "warm"  # room: warm
