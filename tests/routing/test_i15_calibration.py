"""Issue 15: calibration from what replicas show, and the chunked replica model.

No wall-clock assertions: the rate test drives the offline DES timing model
(``sim/des.py``, simulated clock); the replica test asserts completion order.
"""

from __future__ import annotations

import asyncio

import pytest

from routing import Candidate, ReplicaLoad, RouteRequest, build_policy
from routing.calibration import (
    CalibratingLoadTracker,
    Calibration,
    PrefillRateEstimator,
    ReplicaEstimate,
    parse_engine_metrics,
)
from routing.load import InProcessLoadTracker
from routing.scorers import EstimatedTTFTScorer
from sim import des

#: trace rows replayed before the estimate is checked: 2000 rows over 6
#: replicas, about 333 first-byte observations per replica
ROWS = 2000


@pytest.mark.parametrize("mult", [0.25, 4.0])
def test_calibrated_prefill_rate_within_20_percent(mult: float) -> None:
    cfg = des.SimConfig(prefill_tokens_per_s=10000.0 * mult)
    true_rate = cfg.prefill_tokens_per_s / cfg.token_scale  # router (simulator) tokens per second
    cal = Calibration(prior_rate=10000.0)  # the configured constant: wrong by 64x and 4x in router tokens
    des.simulate("cache_aware", build_policy("cache_aware", {}), des.load_trace(rows=ROWS), cfg, cal)
    for i in range(cfg.replicas):
        est = cal.estimate(f"r{i}")
        assert est is not None and est.calibrated
        assert abs(est.prefill_tokens_per_s / true_rate - 1.0) <= 0.20, (i, est)
        assert est.queue_weight >= 0.8  # one prefill at a time: a queued token costs like an own one


def test_estimator_clips_outliers_and_bounds() -> None:
    est = PrefillRateEstimator(1000.0, min_samples=5)
    for k in range(200):
        u = 100.0 + 10 * (k % 7)
        est.observe(u, 0.0, 0.01 + u / 1000.0)
    before = est.estimate()
    assert before is not None and abs(before.prefill_tokens_per_s - 1000.0) < 20
    for _ in range(3):  # a few stalls (e.g. a GC pause) barely move it
        est.observe(100.0, 0.0, 50.0)
    after = est.estimate()
    assert after is not None and abs(after.prefill_tokens_per_s / before.prefill_tokens_per_s - 1) < 0.2
    assert est.estimate().queue_weight == pytest.approx(1.0, abs=0.05)  # q never seen: the prior holds
    fresh = PrefillRateEstimator(1000.0, min_samples=5)
    assert fresh.estimate() is None
    for _ in range(10):
        fresh.observe(100.0, 0.0, 1e-9)  # absurdly fast: clipped at prior x rate_range
    assert fresh.estimate().prefill_tokens_per_s <= 1000.0 * fresh.rate_range


def test_calibrating_tracker_feeds_first_byte_with_queued_tokens() -> None:
    now = [0.0]
    cal = Calibration(prior_rate=100.0, min_samples=1)
    loads = CalibratingLoadTracker(InProcessLoadTracker(), cal, lambda: now[0])
    t1 = loads.dispatch("a", 100, 5)
    t2 = loads.dispatch("a", 50, 5)  # behind 100 queued tokens
    assert loads.snapshot("a").queued_prefill_tokens == 150
    now[0] = 1.0
    t1.first_byte()
    now[0] = 1.5
    t2.first_byte()
    t2.first_byte()  # idempotent: one observation
    assert cal.estimator("a").samples == 2
    t1.finish()
    t2.finish()
    t3 = loads.dispatch("a", 10, 1)
    t3.finish()  # no first byte: no observation
    assert cal.estimator("a").samples == 2
    assert loads.snapshot("a") == ReplicaLoad("a")


def test_queue_weight_makes_queued_tokens_cheaper_on_shared_replicas() -> None:
    req = RouteRequest("t", [], 100, 10, 16)
    fifo = ReplicaEstimate(100.0, 1.0, 0.0, 50)
    shared = ReplicaEstimate(100.0, 0.1, 0.0, 50)
    cands = [Candidate("busy", ReplicaLoad("busy", 1000, 0, 2), 0, shared),
             Candidate("idle", ReplicaLoad("idle", 0, 0, 0), 0, shared)]
    s = EstimatedTTFTScorer(100.0, calibrated=True).score(req, cands)
    assert s == {"busy": pytest.approx((0.1 * 1000 + 100) / 100), "idle": pytest.approx(1.0)}
    cands_fifo = [Candidate(c.replica_id, c.load, 0, fifo) for c in cands]
    assert EstimatedTTFTScorer(100.0, calibrated=True).score(req, cands_fifo)["busy"] == pytest.approx(11.0)
    # one uncalibrated candidate: all use the configured constant (no mixed units)
    mixed = [cands[0], Candidate("idle", ReplicaLoad("idle"), 0, None)]
    assert EstimatedTTFTScorer(100.0, calibrated=True).score(req, mixed)["busy"] == pytest.approx(11.0)
    assert EstimatedTTFTScorer(100.0).score(req, cands)["busy"] == pytest.approx(11.0)  # calibrate off


VLLM_TEXT = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",engine="0"} 3.0
vllm:num_requests_running{model_name="m",engine="1"} 1.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 7.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.5
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 25.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 100.0
"""

SGLANG_TEXT = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 4.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 2.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m"} 0.25
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.4
"""


def test_parse_engine_metrics_vllm_and_sglang_names() -> None:
    v = parse_engine_metrics(VLLM_TEXT)
    assert (v.engine, v.running, v.waiting, v.kv_usage, v.prefix_hit_rate) == ("vllm", 4.0, 7.0, 0.5, 0.25)
    s = parse_engine_metrics(SGLANG_TEXT)
    assert (s.engine, s.running, s.waiting, s.kv_usage, s.prefix_hit_rate) == ("sglang", 4.0, 2.0, 0.25, 0.4)
    assert parse_engine_metrics("# nothing here\n").engine == ""


def test_parse_the_simulators_own_metrics() -> None:
    from prometheus_client import generate_latest

    from sim.replica import ReplicaConfig, ReplicaState

    async def go() -> bytes:
        st = ReplicaState(ReplicaConfig())
        st.running, st.waiting = 2, 5
        return generate_latest(st.metrics.registry)

    s = parse_engine_metrics(asyncio.run(go()).decode())
    assert (s.engine, s.running, s.waiting, s.kv_usage) == ("vllm", 2.0, 5.0, 0.0)


# ------------------------------------------------------------------ the chunked replica model (DES)

def _reqs(*specs: tuple[float, int]) -> list[des.SimRequest]:
    return [des.SimRequest(t, n, 1, ()) for t, n in specs]


def _ttfts(model: str, reqs: list[des.SimRequest]) -> list[float]:
    """TTFT p50 and p99 (linear interpolation; with two requests: their mean
    and 0.01/0.99 between them) on one replica at 1 simulator token/s."""
    cfg = des.SimConfig(replicas=1, prefill_overhead_s=0.0, decode_s_per_token=0.0, replica_model=model,
                        prefill_tokens_per_s=16.0)
    res = des.simulate("rr", build_policy("round_robin", {}), reqs, cfg)
    return [res.ttft_p50, res.ttft_p99]


def test_des_chunked_shares_the_rate_fifo_queues() -> None:
    # two 10-token prompts arriving together: FIFO 10 s and 20 s; shared: both 20 s
    assert _ttfts("fifo", _reqs((0.0, 10), (0.0, 10))) == pytest.approx([15.0, 19.9])
    assert _ttfts("chunked", _reqs((0.0, 10), (0.0, 10))) == pytest.approx([20.0, 20.0])
    # a long prompt (100) then a short one (10) one second later: FIFO makes the
    # short one wait 99 s + 10 s; shared, it finishes 20 s after it arrived and
    # the long one takes 110 s in all
    f = _ttfts("fifo", _reqs((0.0, 100), (1.0, 10)))
    c = _ttfts("chunked", _reqs((0.0, 100), (1.0, 10)))
    assert f == pytest.approx([104.5, 108.91])  # 100 and 109
    assert c == pytest.approx([65.0, 109.1])  # 20 and 110
    with pytest.raises(ValueError):
        des.SimConfig(replica_model="vllm")


def test_replica_chunked_short_prompt_overtakes_long_one() -> None:
    from sim.replica import ReplicaConfig, ReplicaState

    async def order(model: str) -> list[str]:
        st = ReplicaState(ReplicaConfig(replica_model=model, time_scale=1000.0, prefill_tokens_per_s=1600.0,
                                        token_scale=16.0))  # 100 tokens = 1 trace s = 1 ms wall
        done: list[str] = []

        async def one(name: str, n: int) -> None:
            await st.prefill([], n)
            done.append(name)

        # 20000 tokens = 200 ms wall against 0.1 ms: the order survives a loaded host's preemption of
        # the loop between the two starts (1000 = 10 ms did not at load 12, session 13)
        long = asyncio.create_task(one("long", 20000))
        await asyncio.sleep(0)
        short = asyncio.create_task(one("short", 10))
        await asyncio.gather(long, short)
        assert st.running == 2 and st.waiting == 0  # the caller ends requests; nobody waits
        return done

    assert asyncio.run(order("fifo")) == ["long", "short"]
    assert asyncio.run(order("chunked")) == ["short", "long"]
