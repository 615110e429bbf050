"""Tenant limits and the token ledger shared through a real redis-server (tenancy/shared.py, issue 16).

Two :func:`tenancy.shared.make_limits` results with their own Redis clients
stand for two gateway instances.
"""
from __future__ import annotations

import asyncio
import random
import time

import pytest

from gateway.config import StateConfig
from tenancy.ledger import BASES, InProcessLedger
from tenancy.limits import ConcurrencyLimited, LimitExceeded, RateLimited, TenantLimiter
from tenancy.registry import Tenant
from tenancy.shared import RedisLedger, RedisTenantLimiter, SharedLimits, make_limits
from tests.support.waiting import wait_for


def _cfg(url: str, **kw: object) -> StateConfig:
    return StateConfig(backend="redis", url=url, key_prefix="pgtest:", **kw)


@pytest.fixture
async def instances(redis_server):
    """Three instances (own clients) on one redis-server, lease TTL 1 s."""
    made: list[SharedLimits] = [make_limits(_cfg(redis_server.url, lease_ttl_s=1.0)) for _ in range(3)]
    yield made
    for m in made:
        await m.aclose()


async def _try(coro) -> str:
    try:
        await coro
        return "ok"
    except LimitExceeded as exc:
        return exc.reason


async def test_two_instances_share_one_request_bucket_n_not_2n(instances) -> None:
    a, b, _ = instances
    t = Tenant(id="acme", rate_rps=0.001, rate_burst=10)  # ~no refill during the test
    # 40 concurrent admissions, interleaved over two instances: the script is atomic
    outcomes = await asyncio.gather(*(_try((a if i % 2 else b).limiter.admit(t)) for i in range(40)))
    assert outcomes.count("ok") == 10, outcomes
    assert set(outcomes) == {"ok", "tenant_request_rate"}


async def test_two_instances_on_a_fixed_clock_refill_as_one_bucket(instances) -> None:
    a, b, _ = instances
    t = Tenant(id="acme", rate_rps=2.0, rate_burst=4)
    admitted = 0
    for step in range(20):  # 10 s of bucket time, one attempt per instance every 0.5 s
        now = step * 0.5
        for inst in (a, b):
            admitted += await _try(inst.limiter.admit(t, now=now)) == "ok"
    # burst 4 + 2/s x 9.5 s = 23 in one bucket (2 x that if each instance had its own)
    assert admitted == 4 + 19


async def test_concurrency_holds_across_instances_and_a_release_frees_a_slot(instances) -> None:
    a, b, c = instances
    t = Tenant(id="acme", max_concurrency=4)
    held = [await a.limiter.admit(t), await b.limiter.admit(t), await c.limiter.admit(t), await a.limiter.admit(t)]
    for inst in (a, b, c):
        with pytest.raises(ConcurrencyLimited):
            await inst.limiter.admit(t)
    assert await c.limiter.in_flight("acme") == 4
    held[0].release()
    await a.flush()
    lease = await b.limiter.admit(t)
    with pytest.raises(ConcurrencyLimited):
        await c.limiter.admit(t)
    # a batch's extra sequences take slots across instances too
    for h in held[1:]:
        h.release()
    for inst in (a, b, c):
        await inst.flush()
    await b.limiter.add_sequences(t, lease, 3)
    assert await a.limiter.in_flight("acme") == 4
    with pytest.raises(ConcurrencyLimited):
        await a.limiter.admit(t)
    lease.release()
    await b.flush()
    assert await a.limiter.in_flight("acme") == 0


async def test_a_crashed_instance_leaves_no_phantom_slots(redis_server) -> None:
    crashed = make_limits(_cfg(redis_server.url, lease_ttl_s=0.5))
    alive = make_limits(_cfg(redis_server.url, lease_ttl_s=0.5))
    alive.start()  # renews its leases every ttl/3
    try:
        t = Tenant(id="acme", max_concurrency=4)
        mine = await alive.limiter.admit(t)
        for _ in range(3):
            await crashed.limiter.admit(t)  # never released, never renewed: the instance "died"
        await crashed.aclose()
        with pytest.raises(ConcurrencyLimited):
            await alive.limiter.admit(t)
        # the dead instance's slots expire within the lease; the live one's is renewed and stays
        await wait_for(_eq(alive.limiter.in_flight, "acme", 1), timeout_s=10, what="crashed slots expired")
        start = alive.limiter.renewals
        await wait_for(lambda: alive.limiter.renewals >= start + 6, timeout_s=10, what="two lease TTLs of renewals")
        assert await alive.limiter.in_flight("acme") == 1 and not mine.released
        assert alive.limiter.lost_slots == 0
        admitted = [await alive.limiter.admit(t) for _ in range(3)]
        with pytest.raises(ConcurrencyLimited):
            await alive.limiter.admit(t)
        for lease in (mine, *admitted):
            lease.release()
        await alive.flush()
        assert await alive.limiter.in_flight("acme") == 0
    finally:
        await alive.aclose()


def _eq(fn, arg, want):
    async def check() -> bool:
        return await fn(arg) == want
    return check


async def test_prompt_token_bucket_shared_with_debt(instances) -> None:
    a, b, _ = instances
    t = Tenant(id="acme", prompt_tokens_per_s=10.0, prompt_tokens_burst=100.0)
    await a.limiter.charge_prompt_tokens(t, 250, now=0.0)  # full bucket: a prompt above the burst goes into debt
    with pytest.raises(RateLimited) as exc:
        await b.limiter.charge_prompt_tokens(t, 1, now=0.0)
    assert exc.value.reason == "tenant_prompt_tokens"
    assert exc.value.retry_after_s == pytest.approx(15.1)  # level -150 needs 151 tokens at 10/s


def _tenant_variants(rng: random.Random, tid: str) -> Tenant:
    """A tenant whose limits change now and then (a registry reload keeps bucket levels)."""
    def opt(rate_choices, burst_choices):
        rate = rng.choice(rate_choices)
        return rate, (None if rate is None else rng.choice(burst_choices))
    pr, pb = opt([None, 5.0, 20.0, 0.5], [None, 1.0, 50.0, 200.0])
    orr, ob = opt([None, 3.0, 40.0], [None, 10.0, 120.0])
    return Tenant(id=tid, prompt_tokens_per_s=pr, prompt_tokens_burst=pb, output_tokens_per_s=orr,
                  output_tokens_burst=ob)


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_redis_ledger_equals_the_in_process_ledger_on_the_same_operations(redis_server, seed: int) -> None:
    rng = random.Random(seed)
    clock = [0.0]  # both ledgers settle at the sequence's time (refill to it first)
    shared = make_limits(_cfg(redis_server.url), clock=lambda: clock[0])
    try:
        ledger = shared.ledger
        assert isinstance(ledger, RedisLedger)
        local = InProcessLedger(clock=lambda: clock[0])
        tids = ["t1", "t2"]
        tenants = {tid: _tenant_variants(rng, tid) for tid in tids}
        open_pairs: list[tuple] = []
        now = 0.0
        refusals = 0
        for _ in range(250):
            now += rng.choice([0.0, 0.0, 0.05, 0.3, 1.7, 9.0])
            clock[0] = now
            op = rng.random()
            if op < 0.08:
                tid = rng.choice(tids)
                tenants[tid] = _tenant_variants(rng, tid)
            elif op < 0.55 or not open_pairs:
                t = tenants[rng.choice(tids)]
                p, o = rng.randint(0, 300), rng.randint(0, 160)
                errs = []
                pair = []
                for led in (local, ledger):
                    try:
                        r = led.reserve(t, p, o, now)
                        if asyncio.iscoroutine(r):
                            r = await r
                        pair.append(r)
                    except RateLimited as exc:
                        errs.append((exc.reason, exc.retry_after_s))
                if errs:
                    refusals += 1
                    assert len(errs) == 2 and errs[0][0] == errs[1][0], errs
                    assert errs[1][1] == pytest.approx(errs[0][1], rel=1e-12)
                else:
                    open_pairs.append(tuple(pair))
            elif op < 0.65:
                lo, rs = rng.choice(open_pairs)
                n = rng.randint(0, lo.output_tokens + 5)
                lo.lower_output(n)
                rs.lower_output(n)
            else:
                lo, rs = open_pairs.pop(rng.randrange(len(open_pairs)))
                args = (rng.randint(0, 400), rng.randint(0, 200), rng.choice(BASES))
                assert lo.settle(*args) == rs.settle(*args)
                assert rs.settle(0, 0, "usage") == lo.settlement  # idempotent: the first call wins
            await shared.flush()
            for tid in tids:
                for kind in ("prompt", "output"):
                    want = local.level(tid, kind, now)
                    got = await ledger.level(tid, kind, now)
                    assert (want is None) == (got is None), (tid, kind, want, got)
                    if want is not None:
                        assert got == pytest.approx(want, rel=1e-12, abs=1e-9), (tid, kind)
        assert refusals > 5  # the sequence did exercise refusals
        assert await ledger.totals() == local.totals()
    finally:
        await shared.aclose()


@pytest.mark.parametrize("seed", [4, 5])
async def test_redis_limiter_equals_the_in_process_limiter_on_the_same_operations(redis_server, seed: int) -> None:
    rng = random.Random(seed)
    shared = make_limits(_cfg(redis_server.url))
    try:
        limiter = shared.limiter
        assert isinstance(limiter, RedisTenantLimiter)
        local = TenantLimiter(clock=lambda: 0.0)
        t = Tenant(id="acme", rate_rps=2.0, rate_burst=5.0, max_concurrency=6,
                   prompt_tokens_per_s=50.0, prompt_tokens_burst=200.0)
        held: list[tuple] = []
        now = 0.0
        seen: set[str] = set()
        for _ in range(300):
            now += rng.choice([0.0, 0.1, 0.4, 1.3])
            op = rng.random()
            if op < 0.05:
                t = Tenant(id="acme", rate_rps=rng.choice([None, 1.0, 3.0]), rate_burst=rng.choice([None, 2.0, 8.0]),
                           max_concurrency=rng.choice([None, 3, 6]), prompt_tokens_per_s=rng.choice([None, 50.0]),
                           prompt_tokens_burst=200.0)
                if t.rate_rps is None:
                    t = Tenant(id="acme", max_concurrency=t.max_concurrency,
                               prompt_tokens_per_s=t.prompt_tokens_per_s,
                               prompt_tokens_burst=t.prompt_tokens_burst if t.prompt_tokens_per_s else None)
            elif op < 0.45:
                outcome = []
                for lim in (local, limiter):
                    try:
                        r = lim.admit(t, now)
                        if asyncio.iscoroutine(r):
                            r = await r
                        outcome.append(r)
                    except LimitExceeded as exc:
                        outcome.append((exc.reason, exc.retry_after_s))
                a, b = outcome
                if isinstance(a, tuple) or isinstance(b, tuple):
                    assert isinstance(a, tuple) and isinstance(b, tuple), outcome
                    assert a[0] == b[0] and b[1] == pytest.approx(a[1], rel=1e-12)
                    seen.add(a[0])
                else:
                    held.append((a, b))
                    seen.add("ok")
            elif op < 0.6 and held:
                a, b = rng.choice(held)
                extra = rng.randint(1, 3)
                errs = []
                try:
                    local.add_sequences(t, a, extra, now)
                except LimitExceeded as exc:
                    errs.append((exc.reason, exc.retry_after_s))
                try:
                    await limiter.add_sequences(t, b, extra, now)
                except LimitExceeded as exc:
                    errs.append((exc.reason, exc.retry_after_s))
                assert len(errs) in (0, 2) and (not errs or errs[0][0] == errs[1][0]), errs
                assert a.weight == b.weight
            elif op < 0.75:
                n = rng.randint(0, 400)
                errs = []
                try:
                    local.charge_prompt_tokens(t, n, now)
                except LimitExceeded as exc:
                    errs.append((exc.reason, exc.retry_after_s))
                try:
                    await limiter.charge_prompt_tokens(t, n, now)
                except LimitExceeded as exc:
                    errs.append((exc.reason, exc.retry_after_s))
                assert len(errs) in (0, 2), errs
                if errs:
                    assert errs[0][0] == errs[1][0] and errs[1][1] == pytest.approx(errs[0][1], rel=1e-12)
            elif held:
                a, b = held.pop(rng.randrange(len(held)))
                a.release()
                b.release()
                await shared.flush()
            assert await limiter.in_flight("acme") == local.in_flight("acme")
        assert {"ok", "tenant_concurrency", "tenant_request_rate"} <= seen
    finally:
        await shared.aclose()


async def test_memory_backend_has_the_same_async_interface() -> None:
    lim = make_limits(StateConfig())
    assert lim.backend == "memory"
    t = Tenant(id="acme", max_concurrency=1, output_tokens_per_s=1.0, output_tokens_burst=10.0)
    lease = await lim.limiter.admit(t, 0.0)
    with pytest.raises(ConcurrencyLimited):
        await lim.limiter.admit(t, 0.0)
    lease.release()
    assert await lim.limiter.in_flight("acme") == 0
    now = time.monotonic()  # the memory ledger settles on its clock (time.monotonic): one time source
    r = await lim.ledger.reserve(t, 0, 10, now)
    assert r.settle(0, 4, "usage").refunded_output == 6
    assert await lim.ledger.level("acme", "output", now) == pytest.approx(6.0, abs=1.0)
    await lim.flush()
    await lim.aclose()
