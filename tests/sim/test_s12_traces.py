"""Session 12: the Azure and ServeGen loaders and ``python -m sim.des_traces`` (the DES on other traces)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import click
import pytest

from sim.des_traces import build_workload, main, run_cell, scale_to_load, summarize
from sim.trace import TraceFormatError, TraceRequest, sim_prompt_tokens
from sim.trace_azure import AZURE_CODE, load_azure, parse_timestamp, with_system_prompts
from sim.trace_servegen import (MLARGE_LENGTHS, MLARGE_RATES, OFFLINE_A, load_lengths, load_rates,
                                load_servegen_offline, synthesize)

AZ_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_azure_rows_parse_with_seconds_since_first_and_fresh_blocks(tmp_path: Path) -> None:
    p = _write(tmp_path, "a.csv", AZ_HEAD + "2023-11-16 18:17:03.9799600,4808,10\n"
               "2023-11-16 18:17:04.0319600,513,0\n2023-11-16 18:17:05,1,3\n")
    rows = load_azure(p)
    assert [r.input_length for r in rows] == [4808, 513, 1] and [r.output_length for r in rows] == [10, 0, 3]
    assert rows[0].timestamp == 0.0 and rows[1].timestamp == pytest.approx(0.052, abs=1e-6)
    assert rows[2].timestamp == pytest.approx(1.02004, abs=1e-6)
    assert [len(r.hash_ids) for r in rows] == [10, 2, 1]
    assert not set(rows[0].hash_ids) & set(rows[1].hash_ids)  # the "none" model shares nothing
    assert [r.input_length for r in load_azure(p, limit=1, skip=1)] == [513]


@pytest.mark.parametrize(("body", "line", "what"), [
    ("2023-11-16 18:17:03.97,0,1\n", 2, "ContextTokens"),
    ("2023-11-16 18:17:03.97,10\n", 2, "3 fields"),
    ("2023-11-16 18:17:03.97,10,1\nyesterday,10,1\n", 3, "not an Azure"),
    ("2023-11-16 18:17:03.97,10,1\n2023-11-16 18:17:02,10,1\n", 3, "backwards"),
    ("2023-11-16 18:17:03.97,10,-1\n", 2, "GeneratedTokens"),
])
def test_azure_bad_rows_name_the_line(tmp_path: Path, body: str, line: int, what: str) -> None:
    with pytest.raises(TraceFormatError, match=f"line {line}:.*{what}"):
        load_azure(_write(tmp_path, "bad.csv", AZ_HEAD + body))


def test_azure_wrong_header_is_line_1(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match="line 1: header"):
        load_azure(_write(tmp_path, "h.csv", "time,in,out\n"))
    with pytest.raises(ValueError):
        parse_timestamp("2023-11-16 18:17:03.9x")


def test_system_prompts_share_only_within_a_tenant_and_are_seeded() -> None:
    reqs = [TraceRequest(i, float(i), 512 * (1 + i % 6), 5, tuple(range(1000 + 10 * i, 1001 + 10 * i + i % 6)))
            for i in range(60)]
    out, tenants = with_system_prompts(reqs, tenants=4, blocks=4, seed=7)
    assert (out, tenants) == with_system_prompts(reqs, tenants=4, blocks=4, seed=7)
    assert tenants != with_system_prompts(reqs, tenants=4, blocks=4, seed=8)[1]
    for r, o, t in zip(reqs, out, tenants):
        assert len(o.hash_ids) == len(r.hash_ids) and o.input_length == r.input_length
        shared = min(4, len(r.hash_ids) - 1)  # the last block is the user's own
        assert o.hash_ids[shared:] == r.hash_ids[shared:]
        for other, t2 in zip(out, tenants):
            k = min(shared, len(other.hash_ids) - 1)
            if k > 0:
                assert (o.hash_ids[:k] == other.hash_ids[:k]) == (t == t2)
    assert sum(len(set(o.hash_ids[:1]) & {1000 + 10 * i for i in range(60)}) for o in out) == 10  # 1-block prompts


def test_servegen_files_parse_and_bad_rows_name_the_line(tmp_path: Path) -> None:
    rates = load_rates(MLARGE_RATES)
    assert len(rates) == 23328 and any(r.dist == "Weibull" for r in rates)
    assert len(load_lengths(MLARGE_LENGTHS)) == 590
    head = "client_id,window_start_s,rate_rps,iat_cv,iat_dist,dist_arg1,dist_arg2\n"
    with pytest.raises(TraceFormatError, match="line 3: an active window"):
        load_rates(_write(tmp_path, "r.csv", head + "0,0,0,0,,0,0\n0,600,1.5,2,Pareto,1,1\n"))
    with pytest.raises(TraceFormatError, match="line 2: not a client-rate"):
        load_rates(_write(tmp_path, "r2.csv", head + "x,0,0,0,,0,0\n"))
    lhead = "client_id,window_start_s,field,mean,p50,p99,max\n"
    with pytest.raises(TraceFormatError, match="line 2: need 1 <= p50"):
        load_lengths(_write(tmp_path, "l.csv", lhead + "0,0,input_tokens,10,500,600,400\n"))


def test_servegen_sessions_are_seeded_and_extend_their_history() -> None:
    rates, lengths = load_rates(MLARGE_RATES), load_lengths(MLARGE_LENGTHS)
    a, ta = synthesize(rates, lengths, rows=300, seed=1)
    assert (a, ta) == synthesize(rates, lengths, rows=300, seed=1)
    assert a != synthesize(rates, lengths, rows=300, seed=2)[0]
    assert len(a) == len(ta) == 300 and len(set(ta)) > 1
    assert all(x.timestamp <= y.timestamp for x, y in zip(a, a[1:]))
    assert all(len(r.hash_ids) == math.ceil(r.input_length / 512) for r in a)
    # some request reuses a whole earlier prompt's full blocks beyond the system prompt (a next turn)
    third = [r.hash_ids[2] for r in a if len(r.hash_ids) > 2]
    assert len(set(third)) < len(third)


def test_servegen_offline_regroups_blocks_and_rejects_bad_rows(tmp_path: Path) -> None:
    rows = load_servegen_offline(OFFLINE_A)
    assert len(rows) == 93 and rows[0].input_length == 271 and rows[0].hash_ids == (0,)
    assert all(len(r.hash_ids) == math.ceil(r.input_length / 512) for r in rows)
    bad = json.dumps({"input_length": 40, "hash_ids": [0, 1]})
    with pytest.raises(TraceFormatError, match="line 2: need input_length"):
        load_servegen_offline(_write(tmp_path, "o.jsonl", json.dumps({"input_length": 20, "hash_ids": [0, 1]})
                                     + "\n" + bad + "\n"))


def test_scale_to_load_sets_the_offered_work() -> None:
    reqs = load_azure(AZURE_CODE, 200)
    for load in (0.5, 1.0):
        out = scale_to_load(reqs, load)
        work = sum(0.005 + sim_prompt_tokens(r) * 16 / 10000 for r in out)
        assert work / (6 * out[-1].timestamp) == pytest.approx(load)
    with pytest.raises(ValueError):
        scale_to_load(reqs[:1], 1.0)
    assert len(build_workload("azure-conv+sys", 0, 50, 0.5)) == 50


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def test_a_tiny_cell_has_one_row_per_rule_smg_first() -> None:
    lines = run_cell(("azure-conv+sys", 0.7, "default", 2, 80, ("ext0", "rsv_ext0.5", "cand"),
                      (("cand", json.dumps({"queue_externality_weight": 0.5})),)))
    rows = [_cells(x) for x in lines]
    assert [r[3] for r in rows] == ["smg_like", "ext0", "rsv_ext0.5", "cand"]
    assert rows[0][6] == "1.00" and rows[0][12] == "-"
    for r in rows[1:]:
        assert r[13] in ("yes", "**no**") and r[14].endswith("/2")
        assert set(r[12].upper()) <= set("HPQM") and "M" in r[12].upper()
    assert "| ext0 |" in "\n".join(summarize(lines, ["smg_like", "ext0"]))


def test_the_runner_writes_every_cell(tmp_path: Path) -> None:
    out = tmp_path / "t.md"
    assert main(["--rows", "60", "--seeds", "1", "--workloads", "azure-conv,servegen", "--loads", "0.5,1",
                 "--settings", "default;chunked", "--rules", "smg_like,ext0", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    for w in ("azure-conv", "servegen"):
        for ld in ("0.5", "1"):
            for s in ("default", "chunked"):
                for rule in ("smg_like", "ext0"):
                    assert f"| {w} | {ld} | {s} | {rule} |" in text
    assert "| ext0 | " in text.split("cells meeting all four")[1]
    with pytest.raises(click.BadParameter, match="nope"):
        main(["--workloads", "nope", "--out", str(out)])
