"""Review R12b-7 (session 13), second corner: writing a plain answer again without ``cached_tokens``
(up to the whole answer when its usage object cannot be located) is answer work charged to the
tenant's CPU budget like the answer's parse (gateway/answer_cost.py ``metered_rewrite``)."""

from __future__ import annotations

import time
from typing import Any

import pytest

import gateway.pipeline_answer as pipeline_answer
from gateway.answer_cost import metered_rewrite
from gateway.cpu_budget import CpuBudget
from gateway.config_http import LimitsConfig
from tenancy.tenant import parse_tenant

TD = "demo.prefixgate.test"
PROMPT = " ".join(f"u{i}" for i in range(200))  # a repeat hits the tenant's own cache: cached_tokens > 0


def _burn(seconds: float) -> None:
    t0 = time.thread_time()
    while time.thread_time() - t0 < seconds:
        pass


@pytest.fixture
def n_replicas() -> int:
    return 1


@pytest.mark.parametrize("config_overrides", [{
    "limits": {"answer_cpu_meter_bytes": 0, "refused_cpu_ms_per_s": 1.0, "refused_cpu_burst_ms": 20.0},
    "tenancy": {"tenants": [{"id": "tenant-b", "spiffe_ids": [f"spiffe://{TD}/tenant-b/"], "models": ["sim-model"],
                             "pools": ["default"], "max_output_tokens": 256}]},
}])
async def test_the_rewrite_of_a_plain_answer_is_charged_to_its_tenant(stack: Any, monkeypatch: Any) -> None:
    real = pipeline_answer.plain_without_cached
    calls: list[int] = []

    def slow_rewrite(data: bytes, obj: dict[str, Any], usage: dict[str, Any]) -> bytes:
        calls.append(len(data))
        _burn(0.06)  # stands for the whole-answer rewrite of a large answer (~5-10 ms per 8 MiB)
        return real(data, obj, usage)

    monkeypatch.setattr(pipeline_answer, "plain_without_cached", slow_rewrite)
    body = {"model": "sim-model", "prompt": PROMPT, "max_tokens": 2}
    for _ in range(2):
        r = await stack.client.post("/v1/completions", headers=stack.auth("tenant-b/app"), json=body)
        if r.status_code != 200:
            break
        assert "cached_tokens" not in r.text
    assert calls, "no answer carried cached_tokens"
    # before: the rewrite's 60 ms were charged to nobody and the tenant kept being served
    r = await stack.client.post("/v1/completions", headers=stack.auth("tenant-b/app"), json=body)
    assert r.status_code == 429 and r.json()["error"]["code"] == "cpu_budget_exhausted", r.text


def test_metered_rewrite_charges_only_answers_at_the_meter_bound() -> None:
    ticks = [0.0]
    budget = CpuBudget(LimitsConfig(answer_cpu_meter_bytes=1000, refused_cpu_ms_per_s=1.0, refused_cpu_burst_ms=5.0),
                       cpu_clock=lambda: ticks[0])
    tenant = parse_tenant({"id": "t", "spiffe_ids": [f"spiffe://{TD}/t/"], "models": ["m"], "pools": ["p"]}, 0)
    meter = budget.meter(tenant)

    def work(x: int) -> int:
        ticks[0] += 0.05
        return x + 1

    assert metered_rewrite(meter, 999, work, 1) == 2  # below the bound: unmeasured, as the parse
    budget.check(tenant)
    assert metered_rewrite(meter, 1000, work, 2) == 3
    with pytest.raises(Exception) as exc:
        budget.check(tenant)
    assert getattr(exc.value, "code", None) == "cpu_budget_exhausted"
