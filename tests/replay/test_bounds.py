from __future__ import annotations

import pytest

from sim.bounds import compute_bounds, main, oracle_hit_rate, pooled_lru_hit_rate
from sim.kvcache import block_keys
from sim.trace import DEFAULT_TRACE_PATH, TraceRequest, load_mooncake

# Each full 512-token trace block is 32 simulator tokens = two 16-token KV blocks.
A = TraceRequest(0, 0.0, 1024, 1, (0, 1))  # 64 tokens, 4 blocks
B = TraceRequest(1, 1.0, 1536, 1, (0, 1, 2))  # 96 tokens, hits A's 4 blocks
C = TraceRequest(2, 2.0, 1024, 1, (0, 3))  # 64 tokens, hits block 0 (2 KV blocks)


def test_oracle_on_hand_made_trace() -> None:
    b = compute_bounds([A, B, C], replicas=1, capacity_blocks=1000)
    assert b.prompt_tokens == 224
    assert b.oracle == pytest.approx((64 + 32) / 224)
    assert b.pooled == pytest.approx(b.oracle)  # capacity never binds


def test_pooled_lru_evicts_least_recently_used() -> None:
    # capacity 4 blocks: D's 4 blocks evict all of A's, so C misses block 0
    d = TraceRequest(1, 1.0, 1024, 1, (5, 6))
    b = compute_bounds([A, d, C], replicas=2, capacity_blocks=2)
    assert b.pooled == 0.0
    assert b.oracle == pytest.approx(32 / 192)


def test_pooled_lru_evicts_deep_tail_before_shared_head() -> None:
    # capacity 4: B's two new tail blocks are evicted, A's (shared) head survives for C
    b = compute_bounds([A, B, C], replicas=1, capacity_blocks=4)
    assert b.pooled == pytest.approx((64 + 32) / 224)


def test_partial_last_block_is_never_a_hit() -> None:
    # 40 real tokens -> 3 simulator tokens: not a full KV block
    p = TraceRequest(0, 0.0, 1024 + 40, 1, (0, 1, 9))
    b = compute_bounds([p, p], replicas=1, capacity_blocks=100)
    assert b.oracle == pytest.approx(64 / (2 * 67))


def test_tenants_are_isolated() -> None:
    tok_a = block_keys(list(range(32)), 16, "tenant-a")
    tok_b = block_keys(list(range(32)), 16, "tenant-b")
    assert len(tok_a) == 2 and not set(tok_a) & set(tok_b)
    same = [(32, tok_a), (32, tok_b)]
    assert oracle_hit_rate(same, 16) == 0.0
    assert pooled_lru_hit_rate([(32, tok_a), (32, tok_a)], 16, 10) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pooled_lru_hit_rate(same, 16, 0)


def test_reproduces_issue_figures_on_real_trace() -> None:
    """The issue's author measured pooled ~0.228 and oracle ~0.294 on this setting."""
    b = compute_bounds(load_mooncake(DEFAULT_TRACE_PATH, 2000), replicas=6, capacity_blocks=4000)
    assert b.oracle == pytest.approx(0.294, abs=0.0015)
    assert b.pooled == pytest.approx(0.228, abs=0.0015)


def test_cli_prints_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--rows", "50", "--replicas", "2", "--capacity-blocks", "100", "--tenants", "2", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"oracle"' in out and '"tenants": 2' in out
