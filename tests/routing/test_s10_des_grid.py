"""Session 10: the grid's cells in the offline simulation (sim/des_grid.py)."""

from __future__ import annotations

from sim.des import SimRequest
from sim.des_grid import RULES, cell_config, criteria, salted
from sim.grid import CELLS


def test_every_grid_cell_maps_to_its_setting() -> None:
    by = {c.name: cell_config(c) for c in CELLS}
    assert len(by) == 14
    assert by["prefill x0.5"].prefill_tokens_per_s == 5000.0
    assert by["kv x0.5"].capacity_blocks == 2000
    assert by["decode off"].decode_s_per_token == 0.0
    assert by["chunked, time scale 20"].replica_model == "chunked"
    assert by["time scale 20"] == by["default"]  # no gateway latency in the DES
    assert by["prefill x0.5, time scale 20"] == by["prefill x0.5"]
    assert by["kv x0.5, time scale 20"] == by["kv x0.5"]
    assert by["8 tenants, time scale 20"] == by["default"]
    assert by["time scale 2"] == by["default"]  # tenants salt keys; not a replica setting


def test_salting_separates_tenants_and_keeps_one_tenants_chain() -> None:
    r = SimRequest(0.0, 32, 1, (b"a" * 16, b"b" * 16))
    x, y, z = salted([r, r, r], ["tenant-a", "tenant-a", "tenant-b"])
    assert x.keys == y.keys
    assert not set(x.keys) & set(z.keys)
    assert len(z.keys) == 2 and z.prompt_tokens == 32


def test_criteria_are_the_grids() -> None:
    smg = {"p50": 10.0, "p99": 20.0, "hit_pooled": 0.9, "req_mm": 1.3}
    ok = {"p50": 9.9, "p99": 21.0, "hit_pooled": 0.95, "req_mm": 1.2 + 1e-12}
    assert criteria(ok, smg) == (True, True, True, True)
    bad = {"p50": 10.0, "p99": 21.01, "hit_pooled": 0.9499, "req_mm": 1.2001}
    assert criteria(bad, smg) == (False, False, False, False)


def test_rules_are_the_smg_imitation_and_the_weights() -> None:
    assert {"smg_like", "ext0", "ext0.5", "ext1", "ext2"} == set(RULES)
