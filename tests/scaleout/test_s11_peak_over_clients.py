"""Session 11: bench.workers_peak measures every target at the same client counts and credits each
with its own best (its peak over offered concurrency); the ratio of peaks is computed from those."""

from __future__ import annotations

import pytest

from bench.workers_peak_calc import client_counts, cpu_per_request, peak_ratios, peaks, serve_growth


def test_client_counts_parse_one_or_a_list_and_refuse_the_rest() -> None:
    assert client_counts("32") == [32]
    assert client_counts(32) == [32]
    assert client_counts("32,64") == [32, 64]
    for bad in ("", "0", "32,x", "-1"):
        with pytest.raises(SystemExit):
            client_counts(bad)


def test_each_target_gets_its_own_best_count_and_ratios_use_them() -> None:
    gens = [("wrk c32", "wrk", 32), ("wrk c64", "wrk", 64)]
    summary = {"wrk c32": {"redis x1": {"rps": 1000.0}, "redis x2": {"rps": 1100.0},
                           "redis x1 [lean]": {"rps": 900.0}, "redis x2 [lean]": {"rps": None}},
               "wrk c64": {"redis x1": {"rps": 950.0}, "redis x2": {"rps": 1300.0},
                           "redis x1 [lean]": {"rps": 990.0}, "redis x2 [lean]": {"rps": 1485.0}}}
    best = peaks(summary, gens)
    assert best["wrk"]["redis x1"] == {"rps": 1000.0, "clients": 32}  # x1 keeps its better, lower count
    assert best["wrk"]["redis x2"] == {"rps": 1300.0, "clients": 64}
    assert best["wrk"]["redis x2 [lean]"] == {"rps": 1485.0, "clients": 64}  # a missing figure is skipped
    ratios = peak_ratios(best, 2)["wrk"]
    assert ratios == {"redis x2 / redis x1": 1.3, "redis x2 [lean] / redis x1 [lean]": 1.5}


def test_cpu_per_request_splits_the_rest_into_its_parts() -> None:
    row = cpu_per_request({"wrk": {"redis x1": {"rps": 2000.0, "serve_cores": 0.9, "gateway_cores": 1.06,
                                                "replica_cores": 0.08, "redis_cores": 0.1,
                                                "loadgen_cores": 0.08}}})["wrk"]["redis x1"]
    assert (row["serve_us"], row["audit_us"], row["replica_us"], row["redis_us"], row["loadgen_us"]) == (
        450, 80, 40, 50, 40)
    assert row["rest_us"] == 80 + 40 + 50 + 40
    assert "ceiling_xN_over_x1" in row


def test_gateway_parts_ceiling_and_serve_growth() -> None:
    cpu = cpu_per_request({"wrk": {"redis x1": {"rps": 2000.0, "serve_cores": 0.9, "gateway_cores": 1.06,
                                                "replica_cores": 0.08, "redis_cores": 0.1, "loadgen_cores": 0.08},
                                   "redis x2": {"rps": 2500.0, "serve_cores": 1.4, "gateway_cores": 1.6,
                                                "replica_cores": 0.1, "redis_cores": 0.15, "loadgen_cores": 0.1}}})
    one = cpu["wrk"]["redis x1"]
    # without the load generator and replicas the bound only counts the gateway's own parts
    assert one["ceiling_gateway_parts_only"] > one["ceiling_xN_over_x1"]
    assert "ceiling_xN_over_x1" not in cpu["wrk"]["redis x2"]
    assert serve_growth(cpu, 2) == {"wrk": {"redis x2": round(560 / 450, 2)}}
    assert serve_growth(cpu, 1) == {}
