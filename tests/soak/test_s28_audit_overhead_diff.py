"""Session 28 (gwaudit28): bench.audit_overhead_diff's arithmetic (bench code, no server).

The reading separates the "on" gateway's extra CPU per request that follows the machine (the
replicas' change in the same rounds) from the constant part; a wrong pairing or sign would
charge contention to audit work or hide real work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.audit_overhead_diff import extra_us, fit, inflation_pairs, main

CPU = {"gateway_off": {"off": 0.400, "on": 0.004}, "gateway_on": {"off": 0.003, "on": 0.480},
       "gateway_base": {"off": 0.003, "base": 0.440}, "replicas": {"off": 0.200, "on": 0.220, "base": 0.200}}


def test_pairs_take_each_gateway_in_its_own_rounds_against_off() -> None:
    pairs = inflation_pairs("run", CPU)
    assert pairs == [("run", 0.400, 0.480, 0.200, 0.220), ("run base", 0.400, 0.440, 0.200, 0.200)]
    without_base = {k: v for k, v in CPU.items() if k != "gateway_base"}
    assert [p[0] for p in inflation_pairs("run", without_base)] == ["run"]


def test_extra_is_what_the_replicas_change_does_not_explain() -> None:
    on, base = inflation_pairs("run", CPU)
    assert extra_us(on) == pytest.approx(480 - 400 * 1.1)  # replicas +10 %: 40 µs of the 80 follow the machine
    assert extra_us(base) == pytest.approx(40.0)  # replicas unchanged: all of it is the gateway's
    assert extra_us(("x", 0.4, 0.38, 0.2, 0.19)) == pytest.approx(0.0)  # a faster machine, no extra


def test_fit_recovers_a_constant_and_a_slope() -> None:
    # gateway change = 4 % + 1.2 x replicas change, exactly
    pairs = [(str(x), 0.5, 0.5 * (1 + 0.04 + 1.2 * x), 0.2, 0.2 * (1 + x)) for x in (-0.05, 0.0, 0.08, 0.2)]
    a, b, r = fit(pairs)
    assert (a, b, r) == (pytest.approx(0.04), pytest.approx(1.2), pytest.approx(1.0))


def test_inflation_command_reads_result_files(tmp_path: Path) -> None:
    f = tmp_path / "audit_overhead-x.json"
    f.write_text(json.dumps({"cpu_ms_per_request": CPU}))
    out = CliRunner().invoke(main, ["inflation", str(f)])
    assert out.exit_code == 0, out.output
    assert "| x | 0.400 | 0.480 | +20.0 % | 0.200 | 0.220 | +10.0 % | +40 |" in out.output
    assert "| x base | 0.400 | 0.440 | +10.0 % | 0.200 | 0.200 | +0.0 % | +40 |" in out.output
    assert "fit:" in out.output
