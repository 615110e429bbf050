"""Session 16 (issue 14): with the in-process limiter and ledger, ``Admission.admit_now`` and
``check_prompt_now`` answer at once (no coroutine) and refuse exactly as ``admit`` / ``check_prompt``:
the rate and concurrency limits, the empty and oversized prompt, the token buckets (nothing taken then)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission import Admission
from gateway.config_state import StateConfig
from gateway.errors import GatewayError
from gateway.metrics import GatewayMetrics
from tenancy.ledger import Reservation
from tenancy.limits import Lease
from tenancy.registry import Tenant, TenantRegistry
from tenancy.shared import make_limits
from tenancy.tokenizer import WordTokenizer


def _admission() -> Admission:
    return Admission(TenantRegistry.from_config([]), make_limits(StateConfig()), WordTokenizer(), ["m"],
                     GatewayMetrics(), max_messages=256, max_output_tokens=4096, default_max_prompt_tokens=100)


def test_admit_now_gives_a_lease_and_refuses_as_admit() -> None:
    adm = _admission()
    t = Tenant(id="acme", models=frozenset({"m"}), max_concurrency=1)
    lease = adm.admit_now(t)
    assert type(lease) is Lease
    with pytest.raises(GatewayError) as now:
        adm.admit_now(t)
    with pytest.raises(GatewayError) as later:
        asyncio.run(adm.admit(t))
    assert now.value.status == later.value.status == 429 and now.value.code == later.value.code == "concurrency_limited"
    lease.release()
    assert type(adm.admit_now(t)) is Lease  # the slot came back
    rated = Tenant(id="globex", models=frozenset({"m"}), rate_rps=0.001, rate_burst=1)
    adm.admit_now(rated)
    with pytest.raises(GatewayError) as ei:
        adm.admit_now(rated)
    assert ei.value.status == 429 and ei.value.code == "rate_limited" and "Retry-After" in ei.value.headers


def test_check_prompt_now_reserves_and_refuses_as_check_prompt() -> None:
    adm = _admission()
    t = Tenant(id="acme", models=frozenset({"m"}), prompt_tokens_per_s=0.001, prompt_tokens_burst=10)
    res = adm.check_prompt_now(t, 6, 1, 5)
    assert isinstance(res, Reservation) and (res.prompt_tokens, res.output_tokens) == (6, 5)
    for bad, code in ((0, "invalid_request"), (101, "context_length_exceeded"), (5, "token_rate_limited")):
        with pytest.raises(GatewayError) as now:  # 5 more: the bucket holds 4
            adm.check_prompt_now(t, bad, 1, 5)
        with pytest.raises(GatewayError) as later:
            asyncio.run(adm.check_prompt(t, bad, 1, 5))
        assert now.value.code == later.value.code == code
    assert isinstance(adm.check_prompt_now(t, 4, 1, 5), Reservation)  # the refusals took nothing
