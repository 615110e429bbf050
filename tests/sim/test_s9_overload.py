"""Session 9: the smg imitation (``sim.des_smg``), per-request TTFTs from the DES and the
overload summary (``sim.des_overload``)."""

from __future__ import annotations

import math

import pytest

from routing.policies import build_policy
from routing.types import Candidate, ReplicaLoad, RouteRequest
from sim.des import SimConfig, load_trace, simulate
from sim.des_overload import RULES, overtaken, run_setting, summarise
from sim.des_smg import SMGLikePolicy


def _req(prompt: int = 160, blocks: int = 10) -> RouteRequest:
    return RouteRequest("t0", [bytes([i]) for i in range(blocks)], prompt, 10, 16)


def _cand(rid: str, running: int = 0, prefilling: int = 0, matched: int = 0) -> Candidate:
    return Candidate(rid, ReplicaLoad(rid, running_requests=running, prefilling_requests=prefilling), matched)


def test_a_miss_goes_to_the_fewest_running_requests() -> None:
    """Match share 2/10 blocks = 0.2 <= 0.3: the least loaded, not the holder."""
    pick = SMGLikePolicy().choose(_req(), [_cand("a", 5, matched=2), _cand("b", 3), _cand("c", 4)])
    assert (pick.replica_id, pick.reason) == ("b", "min_load")


def test_a_match_stays_with_its_holder_until_the_spill_gate() -> None:
    """Holder at 9 running against a mean of 5 (margin max(4, 2·√5) = 4.47): 9 <= 9.47, stays;
    at 12 (mean 6, margin 4.9, 12 > 10.9 and > 1.5·6) it spills to the least loaded."""
    p = SMGLikePolicy()
    stay = p.choose(_req(), [_cand("a", 9, matched=8), _cand("b", 3), _cand("c", 3)])
    assert (stay.replica_id, stay.reason) == ("a", "cache_match")
    spill = p.choose(_req(), [_cand("a", 12, matched=8), _cand("b", 3), _cand("c", 3)])
    assert (spill.replica_id, spill.reason) == ("b", "spill")


def test_overloaded_replicas_are_left_out_unless_all_are() -> None:
    """FIFO: 8 waiting (9 prefilling) leaves the holder out; when every replica is over, all
    stay candidates and the holder wins again. Chunked replicas report no waiting requests."""
    over = [_cand("a", 9, prefilling=9, matched=8), _cand("b", 9, prefilling=2)]
    assert SMGLikePolicy("fifo").choose(_req(), over).replica_id == "b"
    assert SMGLikePolicy("chunked").choose(_req(), over).replica_id == "a"
    all_over = [_cand("a", 9, prefilling=9, matched=8), _cand("b", 9, prefilling=10)]
    assert SMGLikePolicy("fifo").choose(_req(), all_over).replica_id == "a"
    assert SMGLikePolicy("fifo", overload_waiting=None).choose(_req(), over).replica_id == "a"


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        SMGLikePolicy("paged")
    with pytest.raises(ValueError):
        SMGLikePolicy(balance_rel_threshold=0.5)
    with pytest.raises(ValueError):
        SMGLikePolicy(overload_waiting=0)


def test_simulate_reports_each_requests_ttft_in_request_order() -> None:
    """The per-request TTFTs give the same percentiles as the result; the first request meets an
    idle cluster, so its TTFT is its own prefill (overhead + prompt / rate)."""
    reqs = load_trace(rows=120)
    cfg = SimConfig(replicas=3)
    out: list[float] = []
    res = simulate("ca", build_policy("cache_aware", {}), reqs, cfg, ttft_out=out)
    assert len(out) == len(reqs) and not any(math.isnan(t) for t in out)
    assert summarise(out, res.ttft_p50)["p50"] == pytest.approx(res.ttft_p50)
    first = cfg.prefill_overhead_s + reqs[0].prompt_tokens * cfg.token_scale / cfg.prefill_tokens_per_s
    assert out[0] == pytest.approx(first)


def test_summarise_counts_the_shares_around_a_reference() -> None:
    s = summarise([1.0, 2.0, 3.0, 4.0], 2.0)
    assert (s["le_half"], s["le_p50"], s["le_1.5"]) == (0.25, 0.5, 0.75)
    assert s["mean"] == 2.5 and s["p50"] == 2.5


def test_one_overload_setting_has_a_row_per_rule() -> None:
    """One window of 150 rows at prefill x0.5: one row per rule in order, the imitation's own p50
    ratio exactly 1, every share between 0 and 1."""
    lines = run_setting((("fifo prefill x0.5", {"prefill_tokens_per_s": 5000.0}), 1, 150, tuple(RULES)))
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines]
    assert [r[1] for r in rows] == list(RULES)
    assert rows[0][-1] == "1.00"
    for r in rows:
        assert all(0.0 <= float(x) <= 1.0 for x in r[8:12])
    central = rows[list(RULES).index("central_fifo")]
    assert float(central[11]) < 0.05  # one queue: a later request overtakes only by a shorter prefill


def test_late_binding_holds_requests_in_arrival_order() -> None:
    """With one replica a gateway-side queue changes nothing (one FIFO queue either way); a hold
    as deep as the trace is no hold; on 4 replicas holding every request until a replica's prefill
    is free changes placements (it may not wait for the prefix holder). A hold below 1 is refused."""
    reqs = load_trace(rows=150)
    policy = lambda: build_policy("cache_aware", {})  # noqa: E731
    one = [simulate("ca", policy(), reqs, SimConfig(replicas=1, hold_prefilling=h)) for h in (None, 1)]
    assert (one[0].ttft_p50, one[0].ttft_p99, one[0].hit_rate) == (one[1].ttft_p50, one[1].ttft_p99, one[1].hit_rate)
    free, deep, held = (simulate("ca", policy(), reqs, SimConfig(replicas=4, hold_prefilling=h))
                        for h in (None, len(reqs) + 1, 1))
    assert (free.ttft_p50, free.hit_rate) == (deep.ttft_p50, deep.hit_rate)
    assert held.hit_rate != free.hit_rate
    with pytest.raises(ValueError):
        SimConfig(hold_prefilling=0)


def test_overtaken_counts_later_arrivals_served_first() -> None:
    """Arrivals 0, 3, 6 s; first bytes at 10, 5, 7 s: of the three pairs >= 2 s apart, (0, 3)
    and (0, 6) were overtaken; with a gap of 4 s only (0, 6) counts, and it was overtaken."""
    assert overtaken([0.0, 3.0, 6.0], [10.0, 2.0, 1.0]) == pytest.approx(2 / 3)
    assert overtaken([0.0, 3.0, 6.0], [10.0, 2.0, 1.0], gap_s=4.0) == 1.0
    assert overtaken([0.0, 1.0], [1.0, 1.0]) == 0.0
