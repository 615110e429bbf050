from __future__ import annotations

from sim.des import (
    SGLangLikePolicy,
    SimConfig,
    infinite_bound,
    load_trace,
    pooled_bound,
    simulate,
    to_sim_request,
)
from routing.policies import build_policy


def test_trace_conversion() -> None:
    r = to_sim_request({"timestamp": 1500, "input_length": 512 * 2 + 100, "output_length": 7, "hash_ids": [1, 2, 3]})
    assert r.arrival == 1.5
    assert r.prompt_tokens == 32 + 32 + 7  # ceil(100/512*32) = 7
    assert len(r.keys) == 4  # 2 full 16-token blocks per trace block; the partial block has none
    same_prefix = to_sim_request({"timestamp": 0, "input_length": 512 * 3, "output_length": 1, "hash_ids": [1, 2, 9]})
    assert same_prefix.keys[:4] == r.keys[:4]


def test_cache_aware_beats_round_robin_small_slice() -> None:
    reqs = load_trace(rows=300)
    cfg = SimConfig(replicas=4)
    rr = simulate("rr", build_policy("round_robin", {}), reqs, cfg)
    ca = simulate("ca", build_policy("cache_aware", {}), reqs, cfg)
    sg = simulate("sg", SGLangLikePolicy(), reqs, cfg)
    bound = infinite_bound(reqs)
    assert pooled_bound(reqs, 4 * 4000) <= bound + 1e-9
    assert rr.hit_rate < ca.hit_rate <= bound + 1e-9
    assert sg.hit_rate <= bound + 1e-9
    assert ca.ttft_p50 < rr.ttft_p50
    assert ca.req_imbalance <= 1.5
