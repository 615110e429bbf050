from __future__ import annotations

import pytest

from sim.bench import Target, _targets, measure_overhead, render_overhead, synthetic_requests
from sim.cluster import start_cluster
from sim.replica import ReplicaConfig
from sim.trace import build_prompt, sim_prompt_tokens


def test_synthetic_requests_fixed_rate_unique_prefixes() -> None:
    reqs = synthetic_requests(20.0, 1.5, start_id=100)
    assert len(reqs) == 30
    assert [r.timestamp for r in reqs[:3]] == [0.0, 0.05, 0.1]
    assert len({r.hash_ids for r in reqs}) == 30
    assert all(sim_prompt_tokens(r) == 32 for r in reqs)
    assert build_prompt(reqs[0]) != build_prompt(reqs[1])


def test_target_parsing() -> None:
    assert _targets("prefixgate/cache_aware, sglang/round_robin") == [
        Target("prefixgate", "cache_aware"), Target("sglang", "round_robin")]
    assert Target("sglang", "cache_aware").label == "sglang/cache_aware"
    with pytest.raises(SystemExit):
        _targets("nginx/round_robin")


async def test_measure_overhead_against_a_replica() -> None:
    cluster = await start_cluster(1, ReplicaConfig(time_scale=1000.0))
    logs: list[str] = []
    try:
        direct = await measure_overhead("direct", cluster.urls[0], None, low_rps=40, low_s=0.5, steps=[40, 80],
                                        step_s=0.5, direct=None, id_base=0, log=logs.append)
    finally:
        await cluster.stop()
    assert direct.ttft_p50_ms is not None and 0 < direct.ttft_p50_ms <= direct.ttft_p99_ms
    assert [s["rps"] for s in direct.steps] == [40, 80][: len(direct.steps)]
    assert all(s["errors"] == {} for s in direct.steps)
    if direct.max_sustained_rps is not None:
        assert direct.steps[0]["pass"]
    assert len(logs) == len(direct.steps)
    md = render_overhead([direct])
    assert "| direct |" in md
