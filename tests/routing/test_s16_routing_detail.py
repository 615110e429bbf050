"""Session 16 (helper "routing"): the DES's per-request detail and the session's sweep rules."""

from __future__ import annotations

import math

import pytest

from bench.des_s16_routing import HARSH_CELLS, _rule
from routing.policies import build_policy
from sim.des import SimConfig, SimRequest, simulate
from sim.des_grid import cell_config


def _req(t: float, keys: tuple[bytes, ...], tokens: int = 64) -> SimRequest:
    return SimRequest(t, tokens, 1, keys)


def test_detail_explains_each_ttft_as_wait_plus_own_prefill_on_a_fifo_replica() -> None:
    cfg = SimConfig(replicas=1, prefill_tokens_per_s=16000.0, decode_s_per_token=0.0)
    a, b = (b"a" * 16,) * 1, (b"b" * 16,)
    reqs = [_req(0.0, a + (b"x" * 16,) * 3), _req(0.0, b + (b"y" * 16,) * 3), _req(0.0, a + (b"x" * 16,) * 3)]
    ttft: list[float] = []
    detail: list[dict] = []
    simulate("ca", build_policy("cache_aware", {}), reqs, cfg, ttft_out=ttft, detail_out=detail)
    assert [d["ttft"] for d in detail] == ttft
    assert [d["ahead"] for d in detail] == [0, 1, 2]  # one replica: everyone queues behind the earlier ones
    assert [d["replica"] for d in detail] == ["r0"] * 3
    # each request's own prefill: 0.005 s + uncached tokens x 16 / rate; the third reuses the first's blocks
    assert detail[0]["prefill"] == pytest.approx(0.005 + 64 / 1000)
    assert detail[2]["cached"] == 64 and detail[2]["prefill"] == pytest.approx(0.005)
    # FIFO: the wait of each is the prefill of those ahead of it
    assert detail[1]["ttft"] - detail[1]["prefill"] == pytest.approx(detail[0]["prefill"])
    assert detail[2]["ttft"] - detail[2]["prefill"] == pytest.approx(detail[0]["prefill"] + detail[1]["prefill"])


def test_detail_is_left_alone_when_not_asked_and_changes_no_result() -> None:
    cfg = SimConfig(replicas=2)
    reqs = [_req(0.01 * i, (bytes([i % 3]) * 16,)) for i in range(12)]
    plain = simulate("ca", build_policy("cache_aware", {}), reqs, cfg)
    detail: list[dict] = []
    seen = simulate("ca", build_policy("cache_aware", {}), reqs, cfg, detail_out=detail)
    assert (plain.ttft_p50, plain.ttft_p99, plain.hit_rate) == (seen.ttft_p50, seen.ttft_p99, seen.hit_rate)
    assert len(detail) == 12 and all(not math.isnan(d["ttft"]) for d in detail)


def test_harsh_cells_only_slow_prefill_and_named_rules_parse() -> None:
    by = {c.name: cell_config(c) for c in HARSH_CELLS}
    assert by["prefill x0.4"].prefill_tokens_per_s == 4000.0
    assert by["prefill x0.3"].prefill_tokens_per_s == 3000.0
    assert by["prefill x0.3"].capacity_blocks == 4000 and by["prefill x0.3"].replica_model == "fifo"
    pol = _rule("ca:queue_externality_weight=0.5+queue_externality_work_balance=true+dispatch_share_factor=null")("fifo")
    assert pol.config.queue_externality_weight == 0.5
    assert pol.config.queue_externality_work_balance is True
    assert pol.config.dispatch_share_factor is None
    assert _rule("no_such_rule") is None
