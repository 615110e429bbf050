"""Session 21, review (S21-review-2): the free preparation-CPU allowance follows the prompt tokens the tenant PAID.

An accepted request's preparation CPU (parse + tokenize) above ``prep_cpu_free_ms`` + ``prep_cpu_free_us_per_token``
x its prompt tokens is charged to the tenant's CPU budget (R6-1). The tokens were the reservation's (the gateway's
own count), while the token ledger charges the replica's ``usage.prompt_tokens`` (docs/tenancy.md, basis
``usage``; security.md R7: a replica may count far fewer, e.g. one that does not render ``tools``, or a BPE model
behind the ``word`` tokenizer on JSON). A request whose gateway count is high and whose replica count is low thus
got up to 5 us x (gateway count) of uncharged CPU while its prompt bucket paid only the replica's count: live
(/work/notes/s21-review.md), ``tools`` of ~6,500 word tokens that the simulator counts as 6 ran at the tenant's
full request rate, 50/s x ~9 ms = ~52 % of a gateway core, uncharged, the other tenant's p90 23 -> 44 ms. Now the
allowance counts min(reserved, charged) prompt tokens once the reservation is settled.
"""
from __future__ import annotations

import pytest

from gateway.config_http import LimitsConfig
from gateway.cpu_budget import CpuBudget
from gateway.held import Held
from tenancy.ledger import InProcessLedger
from tenancy.registry import Tenant


class _Clocks:
    def __init__(self) -> None:
        self.now = 100.0
        self.cpu = 0.0
        self.wall = 0.0

    def step(self, ms: float) -> None:
        self.cpu += ms / 1000
        self.wall += ms / 1000


def _held(c: _Clocks, budget: CpuBudget, tenant: Tenant, prep_ms: float, reserved_prompt: int) -> Held:
    held = Held()
    held.cpu = budget.meter(tenant)
    held.cpu.run(c.step, prep_ms)
    held.reservation = InProcessLedger(clock=lambda: c.now).reserve(tenant, reserved_prompt, 1)
    held.progress = "unknown"  # sent to a replica
    return held


@pytest.mark.parametrize("usage_prompt, charged_ms", [(6, 9.0 - 1.0 - 0.03), (6_500, 0.0), (9_000, 0.0), (None, 0.0)])
def test_the_allowance_counts_the_prompt_tokens_the_ledger_charged(usage_prompt: int | None, charged_ms: float) -> None:
    c = _Clocks()
    budget = CpuBudget(LimitsConfig(refused_cpu_ms_per_s=100, refused_cpu_burst_ms=100, prep_cpu_free_ms=1.0,
                                    prep_cpu_free_us_per_token=5.0), clock=lambda: c.now, cpu_clock=lambda: c.cpu, wall_clock=lambda: c.wall)
    tenant = Tenant(id="t")
    held = _held(c, budget, tenant, 9.0, 6_500)  # 9 ms of preparation; reserved 6,500: allowance 33.5 ms
    if usage_prompt is not None:  # the exit path settles the reservation before it releases (InferencePipeline._end)
        held.reservation.settle(usage_prompt, 1, "usage")
    held.release()
    spent = 0.0 if "t" not in budget.buckets else 0.1 - budget.buckets["t"].level
    assert spent * 1000 == pytest.approx(charged_ms)  # 6 paid: allowance 1.03 ms; more paid: the reservation's
