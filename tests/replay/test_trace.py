from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.trace import (
    DEFAULT_TRACE_PATH,
    SIM_TOKENS_PER_TRACE_BLOCK,
    TraceFormatError,
    TraceRequest,
    assign_tenants,
    block_sim_tokens,
    build_prompt,
    conversation_id,
    load_mooncake,
    sim_prompt_tokens,
)
from tenancy.tokenizer import WordTokenizer


def _write(tmp_path: Path, rows: list[dict]) -> Path:
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    return p


def test_load_mooncake_parses_and_converts_ms_to_seconds(tmp_path: Path) -> None:
    p = _write(tmp_path, [
        {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 7]},
        {"timestamp": 2500, "input_length": 512, "output_length": 0, "hash_ids": [0]},
    ])
    reqs = load_mooncake(p)
    assert [r.timestamp for r in reqs] == [0.0, 2.5]
    assert reqs[0].hash_ids == (0, 7) and reqs[1].index == 1
    assert len(load_mooncake(p, limit=1)) == 1


@pytest.mark.parametrize("row", [
    {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0]},  # wrong block count
    {"timestamp": -1, "input_length": 10, "output_length": 5, "hash_ids": [0]},
    {"timestamp": 0, "input_length": 10, "output_length": 5},
    {"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": ["x"]},
])
def test_load_mooncake_rejects_malformed_rows(tmp_path: Path, row: dict) -> None:
    with pytest.raises(TraceFormatError, match="line 1"):
        load_mooncake(_write(tmp_path, [row]))


def test_shipped_trace_loads_with_block_invariant() -> None:
    reqs = load_mooncake(DEFAULT_TRACE_PATH, limit=300)
    assert len(reqs) == 300
    assert all(r.hash_ids[0] == 0 for r in reqs)
    assert reqs == sorted(reqs, key=lambda r: r.timestamp)


def test_prompt_blocks_map_to_exact_token_counts() -> None:
    tok = WordTokenizer()
    req = TraceRequest(0, 0.0, 512 * 2 + 40, 1, (0, 5, 9))
    # 40 real tokens -> ceil(40/16) = 3 simulator tokens
    assert block_sim_tokens(req) == [SIM_TOKENS_PER_TRACE_BLOCK, SIM_TOKENS_PER_TRACE_BLOCK, 3]
    assert len(tok.encode(build_prompt(req))) == sim_prompt_tokens(req) == 67
    tiny = TraceRequest(0, 0.0, 513, 1, (0, 5))
    assert block_sim_tokens(tiny) == [32, 1]  # at least one token for a partial block


def test_shared_blocks_give_identical_token_prefixes() -> None:
    tok = WordTokenizer()
    a = tok.encode(build_prompt(TraceRequest(0, 0.0, 512 * 3, 1, (0, 1, 2))))
    b = tok.encode(build_prompt(TraceRequest(1, 0.0, 512 * 3, 1, (0, 1, 3))))
    c = tok.encode(build_prompt(TraceRequest(2, 0.0, 512 * 2, 1, (0, 4))))
    assert a[:64] == b[:64] and a[64:] != b[64:]
    assert a[:32] == c[:32] and a[32:64] != c[32:64]


def test_real_trace_prompts_match_hash_sharing() -> None:
    tok = WordTokenizer()
    reqs = load_mooncake(DEFAULT_TRACE_PATH, limit=200)
    for r in reqs[:50]:
        assert len(tok.encode(build_prompt(r))) == sim_prompt_tokens(r)
    # two requests of one conversation share their common leading blocks exactly
    by_conv: dict[int, list[TraceRequest]] = {}
    for r in reqs:
        by_conv.setdefault(conversation_id(r), []).append(r)
    pair = next(v for v in by_conv.values() if len(v) > 1)
    x, y = pair[0], pair[1]
    common = 0
    while common < min(len(x.hash_ids), len(y.hash_ids)) - 1 and x.hash_ids[common] == y.hash_ids[common]:
        common += 1
    n = common * SIM_TOKENS_PER_TRACE_BLOCK
    assert common >= 2
    assert tok.encode(build_prompt(x))[:n] == tok.encode(build_prompt(y))[:n]


def test_assign_tenants_is_deterministic_and_per_conversation() -> None:
    reqs = load_mooncake(DEFAULT_TRACE_PATH, limit=500)
    tenants = ["tenant-a", "tenant-b", "tenant-c"]
    t1 = assign_tenants(reqs, tenants, seed=7)
    assert t1 == assign_tenants(reqs, tenants, seed=7)
    # order- and subset-independent
    assert assign_tenants(reqs[100:], tenants, seed=7) == t1[100:]
    conv_tenant: dict[int, str] = {}
    for r, t in zip(reqs, t1):
        assert conv_tenant.setdefault(conversation_id(r), t) == t
    assert set(t1) == set(tenants)
    assert assign_tenants(reqs, tenants, seed=8) != t1
    assert assign_tenants(reqs[:3], seed=1) == ["tenant-a"] * 3
    with pytest.raises(ValueError):
        assign_tenants(reqs, [], seed=0)
