"""Unit tests of the token ledger (tenancy/ledger.py; issue 12, finding 4), on an injected clock."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tenancy.ledger import InProcessLedger, charge_for
from tenancy.limits import RateLimited
from tenancy.registry import Tenant, TenantConfigError, TenantRegistry


def tenant(**kw: object) -> Tenant:
    return Tenant(id="t", **kw)  # type: ignore[arg-type]


LIMITED = tenant(prompt_tokens_per_s=100 / 60, prompt_tokens_burst=100.0,
                 output_tokens_per_s=100 / 60, output_tokens_burst=100.0)


def test_registry_reads_output_limits() -> None:
    doc = {"id": "x", "spiffe_ids": ["spiffe://td/x/"], "output_tokens_per_s": 50}
    t = TenantRegistry.from_config([doc]).get("x")
    assert t is not None and t.output_tokens_per_s == 50.0 and t.output_tokens_burst == 50.0
    with pytest.raises(TenantConfigError, match="output_tokens_burst"):
        TenantRegistry.from_config([{"id": "x", "spiffe_ids": ["spiffe://td/x/"], "output_tokens_burst": 5}])
    with pytest.raises(TenantConfigError, match="output_tokens_per_s"):
        TenantRegistry.from_config([{"id": "x", "spiffe_ids": ["spiffe://td/x/"], "output_tokens_per_s": 0}])


def test_five_concurrent_reservations_of_50_plus_100() -> None:
    led = InProcessLedger(clock=lambda: 0.0)
    held, refused = [], []
    for _ in range(5):
        try:
            held.append(led.reserve(LIMITED, 50, 100, now=0.0))
        except RateLimited as exc:
            refused.append(exc.reason)
    assert len(held) == 1 and refused == ["tenant_output_tokens"] * 4


def test_refused_reservation_takes_nothing_from_either_bucket() -> None:
    led = InProcessLedger(clock=lambda: 0.0)  # one time source: reserve's `now` and the settle clock
    led.reserve(LIMITED, 60, 10, now=0.0)  # prompt 40 left, output 90
    with pytest.raises(RateLimited) as info:
        led.reserve(LIMITED, 50, 10, now=0.0)  # prompt refuses
    assert info.value.reason == "tenant_prompt_tokens" and info.value.retry_after_s == pytest.approx(6.0)
    assert led.level("t", "prompt", now=0.0) == 40 and led.level("t", "output", now=0.0) == 90


def test_settle_refunds_unused_and_takes_excess_as_debt() -> None:
    led = InProcessLedger(clock=lambda: 0.0)  # one time source: reserve's `now` and the settle clock
    res = led.reserve(LIMITED, 50, 100, now=0.0)  # prompt 50, output 0
    s = res.settle(70, 7, "usage")  # the replica counted 20 more prompt tokens, used 7 of 100 output
    assert (s.charged, s.refunded_prompt, s.refunded_output) == (77, 0, 93)
    assert led.level("t", "prompt", now=0.0) == 30 and led.level("t", "output", now=0.0) == 93
    assert res.settle(0, 0, "not_dispatched") is s  # idempotent: the first settlement stands
    t = led.totals()["t"]
    assert t.reserved == {"prompt": 50, "output": 100} and t.charged == {"prompt": 70, "output": 7}
    assert t.open_reservations == 0


def test_refund_never_lifts_a_bucket_above_its_burst() -> None:
    led = InProcessLedger(clock=lambda: 0.0)  # one time source: reserve's `now` and the settle clock
    res = led.reserve(LIMITED, 10, 10, now=0.0)
    res.settle(0, 0, "not_dispatched")  # the bucket refilled meanwhile? here: back to full exactly
    assert led.level("t", "prompt", now=1000.0) == 100 and led.level("t", "output", now=1000.0) == 100


def test_lower_output_refunds_at_once_and_counts_as_refunded() -> None:
    led = InProcessLedger(clock=lambda: 0.0)  # one time source: reserve's `now` and the settle clock
    res = led.reserve(LIMITED, 10, 100, now=0.0)
    res.lower_output(30)
    res.lower_output(60)  # never raises the reservation again
    assert res.output_tokens == 30 and led.level("t", "output", now=0.0) == 70
    s = res.settle(10, 30, "reservation")
    assert s.reserved == 40
    t = led.totals()["t"]
    assert t.reserved["output"] == 100 and t.refunded["output"] == 70 and t.charged["output"] == 30


def test_one_request_above_the_burst_is_served_from_a_full_bucket_into_debt() -> None:
    led = InProcessLedger(clock=lambda: 0.0)  # one time source: reserve's `now` and the settle clock
    t = tenant(output_tokens_per_s=1.0, output_tokens_burst=60.0)
    led.reserve(t, 0, 100, now=0.0)  # needs min(100, 60)
    assert led.level("t", "output", now=0.0) == -40
    with pytest.raises(RateLimited) as info:
        led.reserve(t, 0, 1, now=10.0)
    assert info.value.retry_after_s == pytest.approx(31.0)


def test_no_limits_still_accounts() -> None:
    led = InProcessLedger(clock=lambda: 0.0)  # one time source: reserve's `now` and the settle clock
    res = led.reserve(tenant(), 5, 5, now=0.0)
    res.settle(5, 1, "usage")
    assert led.totals()["t"].charged == {"prompt": 5, "output": 1}
    assert led.level("t", "output") is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 300), st.floats(0, 5)), min_size=1, max_size=40))
def test_bound_burst_plus_rate_times_t_plus_one_overshoot(reqs: list[tuple[int, int, float]]) -> None:
    """Charged (= reserved, settled in full) <= burst + rate x T + max(0, n_max - burst), per bucket."""
    rate, burst = 10.0, 100.0
    t = tenant(prompt_tokens_per_s=rate, prompt_tokens_burst=burst, output_tokens_per_s=rate,
               output_tokens_burst=burst)
    led = InProcessLedger(clock=lambda: 0.0)  # one time source: reserve's `now` and the settle clock
    now, taken = 0.0, {"prompt": 0, "output": 0}
    n_max = {"prompt": 0, "output": 0}
    for prompt, output, dt in reqs:
        now += dt
        try:
            led.reserve(t, prompt, output, now=now).settle(prompt, output, "usage")
        except RateLimited:
            continue
        taken["prompt"] += prompt
        taken["output"] += output
        n_max["prompt"] = max(n_max["prompt"], prompt)
        n_max["output"] = max(n_max["output"], output)
    for k in taken:
        assert taken[k] <= burst + rate * now + max(0, n_max[k] - burst) + 1e-6


@pytest.mark.parametrize(("usage", "progress", "relayed", "expected"), [
    ({"prompt_tokens": 20, "completion_tokens": 7}, "streamed", 3, (20, 7, "usage")),
    ({"completion_tokens": 7}, "unknown", 0, (50, 7, "usage")),          # prompt count missing: ours
    ({"prompt_tokens": 20}, "streamed", 3, (50, 3, "relayed")),          # no completion count: no usage
    ({"prompt_tokens": 20, "completion_tokens": True}, "unknown", 0, (50, 100, "reservation")),
    (None, "streamed", 2, (50, 2, "relayed")),
    (None, "refused", 0, (50, 0, "refused")),
    (None, "unknown", 0, (50, 100, "reservation")),
    (None, "none", 0, (0, 0, "not_dispatched")),
])
def test_charge_for(usage: dict | None, progress: str, relayed: int, expected: tuple[int, int, str]) -> None:
    assert charge_for(50, 100, usage=usage, progress=progress, relayed_output=relayed) == expected


def test_settle_refuses_bad_input() -> None:
    res = InProcessLedger().reserve(tenant(), 1, 1, now=0.0)
    with pytest.raises(ValueError):
        res.settle(-1, 0, "usage")
    with pytest.raises(ValueError):
        res.settle(1, 0, "free")
