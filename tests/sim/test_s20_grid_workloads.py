"""Session 20: ``python -m sim.grid --workload NAME --load X`` (the live grid on the offline simulator's
public workloads): options, cache keys, tenants and salting, and the shared workload module."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import sim.grid as grid
from sim.bounds import compute_bounds
from sim.des_traces import scale_to_load as des_scale_to_load
from sim.grid import CELLS, _key, _parse, render, render_verdicts, select_cells, workload_rows
from sim.report import RouterSummary
from sim.trace import DEFAULT_TRACE_PATH, TraceRequest, load_mooncake
from sim.workloads import OWN_TENANTS, WORKLOADS, scale_to_load

DEFAULT = CELLS[0]
TS20 = next(c for c in CELLS if c.name == "time scale 20")


def _summary(router: str, p50: float) -> RouterSummary:
    return RouterSummary(router=router, requests=60, ok=60, ttft_p50=p50, ttft_p90=2 * p50, ttft_p99=3 * p50,
                         e2e_p50=1.0, e2e_p99=3.0, hit_rate=0.3, pooled_bound=0.3, oracle_bound=0.4,
                         hit_vs_pooled=1.0, hit_vs_oracle=0.75, requests_max=11.0, requests_mean=10.0,
                         prefill_busy_max_s=1.0, prefill_busy_mean_s=1.0)


def _args(workload: str, rows: int = 40, load: float | None = 0.7) -> SimpleNamespace:
    return SimpleNamespace(workload=workload, rows=rows, seed=0, replicas=6, trace=DEFAULT_TRACE_PATH,
                           load=None if workload == "mooncake" else load)


def test_mooncake_keys_are_those_of_the_sessions_before() -> None:
    old = "default|rows=500|run=0|prefixgate"
    assert _key(DEFAULT, 500, 0, "prefixgate") == old
    assert _key(DEFAULT, 500, 0, "prefixgate", workload="mooncake", load=None) == old
    assert _key(TS20, 2000, 2, "smg", '{"a": 1}') == "time scale 20|rows=2000|run=2|smg"
    assert _key(TS20, 2000, 2, "prefixgate", '{"a": 1}') == 'time scale 20|rows=2000|run=2|prefixgate|{"a": 1}'


def test_other_workloads_are_keyed_by_workload_and_load() -> None:
    keys = {_key(DEFAULT, 500, 0, "smg", workload=w, load=ld)
            for w in ("azure-conv+sys", "servegen") for ld in (0.4, 0.7)}
    assert len(keys) == 4 and _key(DEFAULT, 500, 0, "smg") not in keys
    assert _key(DEFAULT, 500, 1, "prefixgate", workload="servegen", load=0.7) \
        == "default|workload=servegen|load=0.7|rows=500|run=1|prefixgate"


def test_render_shows_only_the_chosen_workload_and_load() -> None:
    cache: dict[str, Any] = {}
    for wl, ld, p50 in (("mooncake", None, 1.0), ("servegen", 0.7, 5.0), ("servegen", 0.4, 9.0)):
        for router in ("prefixgate", "smg"):
            cache[_key(DEFAULT, 60, 0, router, workload=wl, load=ld)] = dataclasses.asdict(_summary(router, p50))
    moon = render(cache, 60, 1)
    sg = render(cache, 60, 1, workload="servegen", load=0.7)
    assert "| 1.000 |" in moon and "5.000" not in moon and "9.000" not in moon
    assert "| 5.000 |" in sg and "| 1.000 |" not in sg and "9.000" not in sg
    assert "| default |" in render_verdicts(cache, 60, 1, workload="servegen", load=0.4)
    assert "| default |" not in render_verdicts(cache, 60, 1, workload="azure-conv+sys", load=0.7)


def test_options_default_load_and_mooncake_default(tmp_path: Path) -> None:
    args = _parse(["--workload", "servegen", "--cache", str(tmp_path / "c.json")])
    assert args.workload == "servegen" and args.load == grid.DEFAULT_LOAD
    assert _parse(["--workload", "azure-conv+sys", "--load", "0.4"]).load == 0.4
    moon = _parse([])
    assert moon.workload == "mooncake" and moon.load is None


@pytest.mark.parametrize(("argv", "said"), [
    (["--workload", "nope"], "nope"),
    (["--workload", "mooncake", "--load", "0.5"], "--load applies to the non-Mooncake"),
    (["--workload", "servegen", "--load", "0"], "--load"),
    (["--workload", "azure-conv+sys", "--cells", "default;8 tenants"], "carries its own tenants"),
    (["--cells", "default;no such cell"], "unknown cells: no such cell"),
])
def test_bad_options_are_click_errors(argv: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse(argv)
    assert exc.value.code == 2
    assert said in capsys.readouterr().err


def test_cells_that_set_tenants_are_left_out_only_for_workloads_with_tenants() -> None:
    assert select_cells("", "mooncake") == list(CELLS)
    for w in OWN_TENANTS:
        got = select_cells("", w)
        assert got and all(c.tenants == 1 for c in got)
        assert {c.name for c in CELLS} - {c.name for c in got} == {c.name for c in CELLS if c.tenants != 1}
    assert [c.name for c in select_cells("time scale 20; default", "servegen")] == ["default", "time scale 20"]
    assert [c.name for c in select_cells("8 tenants", "mooncake")] == ["8 tenants"]


def test_workload_rows_reuse_the_simulators_workloads() -> None:
    reqs, own = workload_rows(_args("mooncake"))
    assert own is None and reqs == load_mooncake(DEFAULT_TRACE_PATH, 40)
    for w in ("azure-conv+sys", "azure-code+sys", "servegen"):
        reqs, own = workload_rows(_args(w, load=0.5))
        raw, tenants = WORKLOADS[w](0, 40)
        assert reqs == scale_to_load(raw, 0.5) and own == tenants and len(own) == len(reqs) == 40
        assert len(set(own)) > 1
    assert des_scale_to_load is scale_to_load  # the simulator imports the same function
    slow, _ = workload_rows(_args("azure-conv+sys", load=0.35))
    fast, _ = workload_rows(_args("azure-conv+sys", load=0.7))
    assert slow[-1].timestamp == pytest.approx(2 * fast[-1].timestamp)


def test_bounds_take_the_rows_own_tenants() -> None:
    same = [TraceRequest(i, float(i), 2048, 4, (1, 2, 3, 4)) for i in range(2)]
    kw = {"replicas": 2, "capacity_blocks": 1000}
    shared = compute_bounds(same, **kw, tenants=["x"], assigned=["x", "x"])
    apart = compute_bounds(same, **kw, tenants=["x", "y"], assigned=["x", "y"])
    assert shared.oracle > 0 and apart.oracle == 0 and apart.tenants == 2
    with pytest.raises(ValueError):
        compute_bounds(same, **kw, assigned=["x"])


def test_both_routers_get_the_rows_tenants_prefixgate_as_identity_smg_as_salt(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[dict[str, Any]] = []
    gw_tenants: list[list[str]] = []
    replicas = [{"replica_id": f"r{i}", "url": f"http://127.0.0.1:{i + 1}"} for i in range(6)]

    async def cluster(spec: Any, paths: Any) -> tuple[None, list[dict[str, str]]]:
        return None, replicas

    async def router(*a: Any, **k: Any) -> tuple[None, str]:
        return None, "http://router"

    async def target(label: str, base: str, urls: Any, reqs: Any, tenants: Any, rcfg: Any, bounds: Any,
                     *, headers_for: Any, salt_for: Any) -> tuple[RouterSummary, None]:
        calls.append({"label": label, "tenants": list(tenants), "headers_for": headers_for, "salt_for": salt_for,
                      "pooled": bounds.pooled})
        return _summary(label, 1.0), None

    monkeypatch.setattr(grid, "start_cluster_proc", cluster)
    monkeypatch.setattr(grid, "start_smg_router", router)
    monkeypatch.setattr(grid, "start_gateway", router)
    monkeypatch.setattr(grid, "stop_process", lambda proc: None)
    monkeypatch.setattr(grid, "run_target", target)
    monkeypatch.setattr(grid, "bearer_headers", lambda issuer, names: lambda t: {"x-tenant": t})
    monkeypatch.setattr(grid, "gateway_config", lambda policy, reps, names, paths, **k: gw_tenants.append(list(names)))
    args = SimpleNamespace(**vars(_args("azure-conv+sys", rows=30)), runs=1, cache=tmp_path / "c.json", pg_params="")
    cache: dict[str, Any] = {}
    asyncio.run(grid.run_cell(DEFAULT, args, SimpleNamespace(), None, cache))
    _, own = workload_rows(args)
    pg, sg = calls
    assert pg["label"] == "prefixgate" and sg["label"] == "smg"
    assert pg["tenants"] == sg["tenants"] == own and pg["pooled"] == sg["pooled"]
    assert gw_tenants == [sorted(set(own))]
    assert pg["salt_for"] is None and pg["headers_for"]("tenant-3") == {"x-tenant": "tenant-3"}
    assert sg["headers_for"] is None and all(sg["salt_for"](t) == t for t in own)
    assert set(cache) == {_key(DEFAULT, 30, 0, r, workload="azure-conv+sys", load=0.7) for r in ("prefixgate", "smg")}
    assert (tmp_path / "c.json").exists()


def test_keep_work_is_off_unless_asked() -> None:
    """S20-GT2: the work directory (gateway logs, audit) is removed unless ``--keep-work`` is given."""
    assert _parse([]).keep_work is False
    assert _parse(["--keep-work"]).keep_work is True
