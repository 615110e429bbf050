"""bench.loadgen (wrk output parser, wrk Lua script, the missing-wrk error) and bench.overhead's
fair ordering (run_order, slot_check). No wrk needed: the parser reads captured samples."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from bench import loadgen, overhead

# Captured from `wrk -t1 -c4 -d1s --latency -s <wrk_script(...)> URL` (wrk 4.1.0, Debian 12) against a
# server answering 501 to every POST.
SAMPLE_NON_2XX = """Running 1s test @ http://127.0.0.1:40755/v1/completions
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.90ms    0.93ms   9.10ms   84.24%
    Req/Sec     2.09k   150.36     2.31k    60.00%
  Latency Distribution
     50%    1.71ms
     75%    2.11ms
     90%    2.87ms
     99%    5.88ms
  2076 requests in 1.00s, 1.10MB read
  Non-2xx or 3xx responses: 2076
Requests/sec:   2075.44
Transfer/sec:      1.10MB
"""

# The same layout with socket errors and microsecond / second latencies (the lines wrk prints then).
SAMPLE_SOCKET_ERRORS = """Running 8s test @ http://127.0.0.1:41000/v1/completions
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency   850.12us    1.20ms   1.01s    97.00%
    Req/Sec     5.10k   300.00     5.50k    70.00%
  Latency Distribution
     50%  612.00us
     75%  800.00us
     90%    1.10ms
     99%    4.20ms
  40800 requests in 8.00s, 12.00MB read
  Socket errors: connect 0, read 12, write 1, timeout 3
Requests/sec:   5100.00
Transfer/sec:      1.50MB
"""


def test_parse_wrk_counts_non_2xx_answers_as_errors() -> None:
    doc = loadgen.parse_wrk(SAMPLE_NON_2XX)
    assert doc["requests"] == 2076 and doc["non_2xx"] == 2076 and doc["ok"] == 0 and doc["errors"] == 2076
    assert doc["duration_s"] == pytest.approx(1.0) and doc["rps"] == pytest.approx(2075.44)
    assert doc["latency_ms"] == {"avg": 1.9, "stdev": 0.93, "max": 9.1, "p50": 1.71, "p75": 2.11,
                                 "p90": 2.87, "p99": 5.88}


def test_parse_wrk_reads_socket_errors_and_units() -> None:
    doc = loadgen.parse_wrk(SAMPLE_SOCKET_ERRORS)
    assert doc["socket_errors"] == {"connect": 0, "read": 12, "write": 1, "timeout": 3}
    assert doc["errors"] == 16 and doc["ok"] == 40800 and doc["non_2xx"] == 0
    assert doc["latency_ms"]["p50"] == pytest.approx(0.612) and doc["latency_ms"]["max"] == pytest.approx(1010.0)
    assert doc["duration_s"] == pytest.approx(8.0)


def test_parse_wrk_without_a_summary_raises() -> None:
    with pytest.raises(ValueError, match="requests in"):
        loadgen.parse_wrk("unable to connect to 127.0.0.1:9 Connection refused\n")


def test_wrk_script_sends_the_headers_and_a_unique_json_body() -> None:
    script = loadgen.wrk_script({"Authorization": 'Bearer a"b', "Content-Type": "application/json"})
    assert 'wrk.method = "POST"' in script
    assert 'wrk.headers["Authorization"] = "Bearer a\\"b"' in script
    assert 'wrk.headers["Content-Type"] = "application/json"' in script
    # The body template, with the Lua concatenations filled in, is the JSON the Python generator sends.
    m = re.search(r"local body = '(.*)' \.\. table\.concat\(words, \" \"\) \.\. '(.*)'", script)
    assert m is not None
    doc = json.loads(m.group(1) + "w1x0 w1x1" + m.group(2))
    assert doc == {"model": "sim-model", "prompt": "w1x0 w1x1", "max_tokens": 1}
    assert 'thread:set("tid"' in script  # per-thread ids: prompts stay unique across wrk threads


def test_wrk_generator_missing_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadgen.shutil, "which", lambda name: None)
    with pytest.raises(loadgen.WrkMissingError, match="apt-get install -y wrk"):
        loadgen.require_generator("wrk")
    loadgen.require_generator("python")  # needs nothing
    with pytest.raises(ValueError, match="unknown load generator"):
        loadgen.require_generator("ab")


def test_overhead_refuses_wrk_when_missing_before_starting_anything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loadgen.shutil, "which", lambda name: None)

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("the benchmark started although wrk is missing")

    monkeypatch.setattr(overhead, "run_bench", boom)
    with pytest.raises(SystemExit, match="no `wrk` executable"):
        overhead.main(["--load-generator", "wrk"])


@pytest.mark.parametrize("n", [2, 3, 5])
def test_run_order_measures_every_pair_in_both_orders_over_two_runs(n: int) -> None:
    names = [f"t{i}" for i in range(n)]
    for first in (0, 2):
        orders = [overhead.run_order(names, first), overhead.run_order(names, first + 1)]
        assert all(sorted(o) == names for o in orders)
        for a, b in itertools.combinations(names, 2):
            assert {o.index(a) < o.index(b) for o in orders} == {True, False}, (a, b, orders)


def test_slot_check_reports_ratios_spread_and_order() -> None:
    def row(order: list[str], starts: list[str], pg: float, bl: float) -> dict[str, object]:
        return {"order": order, "start_order": starts,
                "prefixgate": {"peak": {"rps": pg}, "sequential": {"p50_ms": 1.0}},
                "baseline": {"peak": {"rps": bl}, "sequential": {"p50_ms": 1.1}}}

    pb, bp = ["prefixgate", "baseline"], ["baseline", "prefixgate"]
    c = overhead.slot_check([row(pb, pb, 100, 120), row(bp, bp, 100, 90), row(pb, bp, 100, 100)])
    assert [x["peak_ratio"] for x in c["runs"]] == [1.2, 0.9, 1.0]
    assert [x["b_second"] for x in c["runs"]] == [True, False, True]
    assert [x["b_started_second"] for x in c["runs"]] == [True, False, False]
    assert c["peak_ratio_median"] == 1.0 and c["peak_spread"] == pytest.approx(0.3)
    assert c["peak_ratio_b_second"] == pytest.approx(1.1) and c["peak_ratio_b_first"] == 0.9
    assert c["p50_ratio_median"] == 1.1


def test_measure_run_interleaves_slices_of_every_target(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    from types import SimpleNamespace

    calls: list[tuple[str, str, float]] = []

    async def seq_raw(url: str, headers: object, n: int, bodies: object) -> tuple[list[float], int]:
        calls.append(("seq", url.split("/")[2], n))
        return [1.0] * n, 0

    async def seq(url: str, headers: object, n: int, bodies: object) -> dict[str, object]:
        calls.append(("warm", url.split("/")[2], n))
        return {}

    async def peak(gen: str, url: str, headers: object, clients: int, seconds: float, bodies: object,
                   **kw: object) -> dict[str, object]:
        calls.append(("peak", url.split("/")[2], seconds))
        return {"ok": 100, "errors": 0, "wall_s": seconds, "rps": 100 / seconds, "loadgen_cpu_s": seconds / 2,
                "loadgen_cores": 0.5}

    async def settle(cpus: object) -> float:
        return 0.0

    monkeypatch.setattr(overhead, "_sequential_raw", seq_raw)
    monkeypatch.setattr(overhead, "sequential", seq)
    monkeypatch.setattr(overhead.loadgen, "peak", peak)
    monkeypatch.setattr(overhead, "settle", settle)
    cpu = SimpleNamespace(seconds=lambda: 0.0)
    targets = {"a": ("http://a", {}, cpu), "b": ("http://b", {}, cpu)}
    args = SimpleNamespace(slices=2, sequential=5, peak_warmup=0.5, load_generator="python", clients=4,
                           seconds=2.0, wrk_threads=1)
    out = asyncio.run(overhead.measure_run(targets, ["a", "b"], args, overhead._Body(False)))
    measured = [(k, t) for k, t, x in calls if k == "seq" or (k == "peak" and x != 0.5)]  # 0.5 s: warm-up
    assert measured == [("seq", "a"), ("seq", "b"), ("seq", "b"), ("seq", "a"),
                        ("peak", "a"), ("peak", "b"), ("peak", "b"), ("peak", "a")]
    assert sorted(n for k, t, n in calls if k == "seq" and t == "a") == [2, 3]  # 5 requests in 2 slices
    assert [s for k, t, s in calls if k == "peak" and t == "a"] == [0.5, 1.0, 1.0]  # warm-up, then 2 x 1 s
    assert out["a"]["sequential"]["n"] == 5 and out["a"]["peak"]["rps"] == 100.0
    assert out["a"]["peak"]["slices_rps"] == [100.0, 100.0] and out["a"]["peak"]["loadgen_cores"] == 0.5
