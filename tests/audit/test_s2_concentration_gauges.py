"""The concentration monitor's gauges (children looked up once per pool/replica) always
show the stats of each pool's last observation."""
from __future__ import annotations

import random

import pytest

from audit.concentration import ConcentrationMonitor


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gauges_equal_the_stats_after_every_observation(seed: int) -> None:
    rnd = random.Random(seed)
    mon = ConcentrationMonitor(window_s=5, hold_s=3, min_requests=5)
    pools = {"p1": ["a", "b", "c"], "p2": ["d", "e"]}
    t = 0.0
    for _ in range(400):
        pool = rnd.choice(sorted(pools))
        replica = rnd.choice(pools[pool])
        prompt = rnd.randint(1, 500)
        cached = rnd.randint(0, prompt)
        t += rnd.random() * 0.2
        mon.observe(pool, replica, prompt - cached, prompt, cached, t)
        st = mon.stats(pool)
        assert mon.registry.get_sample_value("prefixgate_pool_concentration_hhi", {"pool": pool}) == st["hhi"]
        assert mon.admin_registry.get_sample_value("prefixgate_pool_max_mean_ratio", {"pool": pool}) \
            == st["max_mean_ratio"]
        if st["hit_rate"] is not None:
            assert mon.registry.get_sample_value("prefixgate_pool_prefix_hit_rate", {"pool": pool}) == st["hit_rate"]
        for r, share in st["shares"].items():  # type: ignore[union-attr]
            labels = {"pool": pool, "replica": r}
            assert mon.admin_registry.get_sample_value("prefixgate_replica_request_share", labels) == share
            assert mon.admin_registry.get_sample_value("prefixgate_replica_prefill_share", labels) \
                == st["prefill_shares"][r]  # type: ignore[index]
