from __future__ import annotations

import math

import pytest

from tenancy.limits import (
    ConcurrencyLimited,
    RateLimited,
    TenantLimiter,
    TokenBucket,
    clamp_max_tokens,
)
from tenancy.source_limits import SourceLimiter, source_key
from tenancy.registry import Tenant


def tenant(**kw) -> Tenant:
    return Tenant(id=kw.pop("id", "acme"), **kw)


def test_request_bucket_burst_then_retry_after() -> None:
    lim = TenantLimiter()
    t = tenant(rate_rps=2.0, rate_burst=3.0)
    for _ in range(3):
        lim.admit(t, now=100.0).release()
    with pytest.raises(RateLimited) as ei:
        lim.admit(t, now=100.0)
    assert ei.value.reason == "tenant_request_rate"
    assert ei.value.retry_after_s == pytest.approx(0.5)
    assert ei.value.retry_after_header == "1"
    # Refill: after 0.5 s exactly one more request fits.
    lim.admit(t, now=100.5).release()
    with pytest.raises(RateLimited):
        lim.admit(t, now=100.5)


def test_refused_request_consumes_nothing() -> None:
    lim = TenantLimiter()
    t = tenant(rate_rps=1.0, rate_burst=1.0)
    lim.admit(t, now=0.0).release()
    for _ in range(5):
        with pytest.raises(RateLimited):
            lim.admit(t, now=0.5)
    lim.admit(t, now=1.0).release()


def test_unlimited_tenant_always_admitted() -> None:
    lim = TenantLimiter()
    t = tenant()
    leases = [lim.admit(t, now=0.0) for _ in range(1000)]
    assert lim.in_flight("acme") == 1000
    for lease in leases:
        lease.release()
    assert lim.in_flight("acme") == 0


def test_concurrency_limit_and_idempotent_release() -> None:
    lim = TenantLimiter()
    t = tenant(max_concurrency=2)
    a = lim.admit(t, now=0.0)
    b = lim.admit(t, now=0.0)
    with pytest.raises(ConcurrencyLimited) as ei:
        lim.admit(t, now=0.0)
    assert ei.value.retry_after_s > 0 and ei.value.reason == "tenant_concurrency"
    a.release()
    a.release()  # idempotent: must not free b's slot too
    assert a.released and lim.in_flight("acme") == 1
    c = lim.admit(t, now=0.0)
    with pytest.raises(ConcurrencyLimited):
        lim.admit(t, now=0.0)
    b.release()
    c.release()
    assert lim.in_flight("acme") == 0


def test_concurrency_is_per_tenant() -> None:
    lim = TenantLimiter()
    a = tenant(id="a", max_concurrency=1)
    b = tenant(id="b", max_concurrency=1)
    lim.admit(a, now=0.0)
    lim.admit(b, now=0.0)  # b is unaffected by a
    with pytest.raises(ConcurrencyLimited):
        lim.admit(a, now=0.0)


async def test_lease_async_context_manager_releases_on_error() -> None:
    lim = TenantLimiter()
    t = tenant(max_concurrency=1)
    with pytest.raises(RuntimeError):
        async with lim.admit(t, now=0.0):
            assert lim.in_flight("acme") == 1
            raise RuntimeError("upstream failed")
    assert lim.in_flight("acme") == 0
    with lim.admit(t, now=0.0):
        assert lim.in_flight("acme") == 1
    assert lim.in_flight("acme") == 0


def test_prompt_token_bucket_with_debt() -> None:
    lim = TenantLimiter()
    t = tenant(prompt_tokens_per_s=100.0, prompt_tokens_burst=200.0, max_prompt_tokens=1000)
    lim.charge_prompt_tokens(t, 150, now=0.0)  # level 50
    with pytest.raises(RateLimited) as ei:
        lim.charge_prompt_tokens(t, 100, now=0.0)
    assert ei.value.reason == "tenant_prompt_tokens"
    assert ei.value.retry_after_s == pytest.approx(0.5)
    # A prompt larger than the burst is admitted when the bucket is full, then debt.
    lim.charge_prompt_tokens(t, 500, now=10.0)  # level 200 -> -300
    with pytest.raises(RateLimited) as ei:
        lim.charge_prompt_tokens(t, 1, now=10.0)
    assert ei.value.retry_after_s == pytest.approx(3.01)


def test_limits_follow_tenant_reconfiguration() -> None:
    lim = TenantLimiter()
    lim.admit(tenant(rate_rps=1.0, rate_burst=1.0), now=0.0).release()
    with pytest.raises(RateLimited):
        lim.admit(tenant(rate_rps=1.0, rate_burst=1.0), now=0.1)
    # After a reload raising the rate, the same bucket (level kept) refills faster:
    # at 0.2 s it holds 0.2 (accrued at the old rate), 0.02 s later 0.2 + 2 = 2.2.
    fast = tenant(rate_rps=100.0, rate_burst=5.0)
    with pytest.raises(RateLimited) as ei:
        lim.admit(fast, now=0.2)
    assert ei.value.retry_after_s == pytest.approx(0.008)
    lim.admit(fast, now=0.22).release()
    lim.admit(fast, now=0.22).release()


def test_token_bucket_never_over_burst() -> None:
    b = TokenBucket(rate=10.0, burst=2.0, now=0.0)
    assert b.try_take(1, 1000.0) == 0.0
    assert b.try_take(1, 1000.0) == 0.0
    assert b.try_take(1, 1000.0) == pytest.approx(0.1)
    assert math.isinf(b.try_take(3, 2000.0))
    with pytest.raises(ValueError):
        TokenBucket(rate=0, burst=1, now=0)


def test_source_limiter_limits_per_source() -> None:
    src = SourceLimiter(rate=1.0, burst=2.0)
    src.check("192.0.2.1", now=0.0)
    src.check("192.0.2.1", now=0.0)
    with pytest.raises(RateLimited) as ei:
        src.check("192.0.2.1", now=0.0)
    assert ei.value.reason == "source_request_rate" and ei.value.retry_after_s == pytest.approx(1.0)
    src.check("192.0.2.2", now=0.0)
    src.check("192.0.2.1", now=1.0)


def test_source_limiter_memory_bounded_lru() -> None:
    src = SourceLimiter(rate=1.0, burst=1.0, max_sources=100)
    src.check("10.0.0.1", now=0.0)
    for i in range(5000):
        src.check(f"10.1.{i // 256}.{i % 256}", now=0.0)
        if i % 50 == 0:
            with pytest.raises(RateLimited):  # recently used: kept, still limited
                src.check("10.0.0.1", now=0.0)
    assert len(src) <= 100


def test_source_key_groups_ipv6_by_prefix() -> None:
    assert source_key("2001:db8::1") == source_key("2001:db8::ffff") == "2001:db8::/64"
    assert source_key("2001:db8:0:1::1") != source_key("2001:db8::1")
    assert source_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert source_key("unix:/tmp/sock") == "unix:/tmp/sock"
    src = SourceLimiter(rate=1.0, burst=1.0)
    src.check("2001:db8::1", now=0.0)
    with pytest.raises(RateLimited):
        src.check("2001:db8::2", now=0.0)


@pytest.mark.parametrize(
    "requested,tenant_cap,policy_cap,expected",
    [
        (None, 1024, None, 1024),
        (None, 1024, 256, 256),
        (2000, 1024, None, 1024),
        (100, 1024, 512, 100),
        (5000, None, None, 5000),
        (600, None, 512, 512),
    ],
)
def test_clamp_max_tokens(requested, tenant_cap, policy_cap, expected) -> None:
    assert clamp_max_tokens(requested, tenant_cap, policy_cap, default=99_999) == expected


def test_clamp_max_tokens_always_bounded() -> None:
    assert clamp_max_tokens(None, None, None, default=64) == 64
    with pytest.raises(ValueError):
        clamp_max_tokens(0, 10, None, default=64)
