"""Redis round trips of the shared limits (issue 16, session 5: ``serve --workers`` peak rate).

The script calls made in one event-loop tick leave as one pipeline
(tenancy/shared_batch.py), and the queued releases and settlements of one
tenant are one ``APPLY`` call (tenancy/shared_store.py ``Writer``), with
the semantics of separate calls. Counted on a real redis-server through
``INFO stats`` (socket reads: about one per round trip) and ``INFO
commandstats`` (top-level calls).
"""
from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from gateway.config import StateConfig
from tenancy.limits import LimitExceeded
from tenancy.registry import Tenant
from tenancy.shared import SharedLimits, make_limits
from tests.support.waiting import wait_for


@pytest.fixture
async def setup(redis_server):
    """One instance's limits on a real redis-server, and an independent client to read counters."""
    limits = make_limits(StateConfig(backend="redis", url=redis_server.url, key_prefix="pgb:", lease_ttl_s=5.0))
    probe = aioredis.Redis.from_url(redis_server.url)
    yield limits, probe
    await limits.aclose()
    await probe.aclose()


async def _reads(probe) -> int:
    return int((await probe.info("stats"))["total_reads_processed"])


async def _calls(probe, cmd: str) -> int:
    stats = await probe.info("commandstats")
    return int(stats.get(f"cmdstat_{cmd}", {}).get("calls", 0))


async def _outcome(coro) -> object:
    try:
        return await coro
    except LimitExceeded as exc:
        return exc.reason


async def test_concurrent_admissions_share_round_trips_and_keep_the_limit(setup) -> None:
    limits, probe = setup
    t = Tenant(id="acme", rate_rps=0.001, rate_burst=5, max_concurrency=100)
    await limits.limiter.admit(Tenant(id="warm"))  # connection and script loaded
    before = await _reads(probe)
    outcomes = await asyncio.gather(*(_outcome(limits.limiter.admit(t)) for _ in range(20)))
    used = await _reads(probe) - before - 1  # the second INFO is a read too
    # one bucket, 20 callers: exactly the burst admitted, each caller its own answer
    assert sum(1 for o in outcomes if not isinstance(o, str)) == 5
    assert outcomes.count("tenant_request_rate") == 15
    # 20 separate calls were 20 round trips; in one tick they are one pipeline (a few reads at most)
    assert used <= 3, used


async def test_releases_and_settlements_of_a_tenant_are_one_call_without_script_exists(setup) -> None:
    limits, probe = setup
    t = Tenant(id="acme", max_concurrency=50, prompt_tokens_per_s=1000, prompt_tokens_burst=10_000)
    leases, reservations = [], []
    for _ in range(10):
        leases.append(await limits.limiter.admit(t))
        reservations.append(await limits.ledger.reserve(t, 10, 5))
    assert await limits.limiter.in_flight("acme") == 10
    evalsha, zrem = await _calls(probe, "evalsha"), await _calls(probe, "zrem")
    for lease, res in zip(leases, reservations, strict=True):
        lease.release()
        res.settle(10, 5, "usage")
    await limits.flush()
    # 10 releases + 10 settlements: one APPLY for the tenant (each was its own command before:
    # 10 ZREM and 10 EVALSHA, plus a SCRIPT EXISTS per pipeline)
    assert await _calls(probe, "evalsha") - evalsha <= 2
    assert await _calls(probe, "script|exists") == 0
    assert await limits.limiter.in_flight("acme") == 0
    totals = (await limits.ledger.totals())["acme"]
    assert totals.open_reservations == 0 and totals.charged == {"prompt": 100, "output": 50}
    assert zrem <= await _calls(probe, "zrem")


async def test_an_update_redis_refuses_is_dropped_alone(setup) -> None:
    limits, probe = setup
    t = Tenant(id="acme", max_concurrency=5)
    lease = await limits.limiter.admit(t)
    res = await limits.ledger.reserve(t, 10, 5)
    await probe.delete("pgb:{t:acme}:led:tot")
    await probe.set("pgb:{t:acme}:led:tot", "not a hash")  # the settlement's HGET fails: WRONGTYPE
    res.settle(10, 5, "usage")
    lease.release()
    await limits.flush()
    assert limits.writer is not None and limits.writer.refused == 1
    assert await limits.limiter.in_flight("acme") == 0  # the release in the same call was applied


async def test_scripts_flushed_from_redis_are_loaded_again(setup) -> None:
    limits, probe = setup
    t = Tenant(id="acme", rate_rps=100, rate_burst=100, max_concurrency=10)
    (await limits.limiter.admit(t)).release()
    await limits.flush()
    await probe.script_flush()  # as after a Redis restart
    leases = await asyncio.gather(*(limits.limiter.admit(t) for _ in range(3)))
    res = await limits.ledger.reserve(t, 1, 1)
    assert await limits.limiter.in_flight("acme") == 3
    await probe.script_flush()
    for lease in leases:
        lease.release()
    res.settle(1, 1, "usage")
    await limits.flush()
    assert await limits.limiter.in_flight("acme") == 0
    assert (await limits.ledger.totals())["acme"].open_reservations == 0


async def test_a_caller_cancelled_before_the_batch_leaves_takes_no_slot(setup) -> None:
    limits, probe = setup
    t = Tenant(id="acme", max_concurrency=10)
    task = asyncio.ensure_future(limits.limiter.admit(t))
    await asyncio.sleep(0)  # the call is queued, the batch not yet sent
    task.cancel()
    kept = await limits.limiter.admit(t)
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await limits.limiter.in_flight("acme") == 1
    kept.release()
    await limits.flush()
    await wait_for(lambda: limits.writer is not None and limits.writer.pending == 0)


async def test_every_caller_of_a_batch_gets_the_connection_error(redis_server) -> None:
    from tenancy.shared_failover import unavailable_errors

    # a stopped server resets at once; the timeout only bounds the live admit before it (0.3 s: load-flaky)
    limits: SharedLimits = make_limits(StateConfig(backend="redis", url=redis_server.url, key_prefix="pgb:",
                                                   command_timeout_s=2.0))
    try:
        t = Tenant(id="acme", max_concurrency=10)
        await limits.limiter.admit(t)
        redis_server.stop()
        outcomes = await asyncio.gather(*(limits.limiter.admit(t) for _ in range(5)), return_exceptions=True)
        assert all(isinstance(o, unavailable_errors()) for o in outcomes), outcomes
    finally:
        await limits.aclose()



async def test_calls_queued_behind_a_batch_that_timed_out_fail_with_it(redis_server) -> None:
    """A hung Redis (SIGSTOP): the calls queued while the first batch waited for its reply are not
    sent after it (each would wait its own timeout): they get the same error, one batch in all."""
    import os
    import signal

    from tenancy.shared_failover import unavailable_errors

    limits: SharedLimits = make_limits(StateConfig(backend="redis", url=redis_server.url, key_prefix="pgb:",
                                                   command_timeout_s=0.3))
    try:
        t = Tenant(id="acme", max_concurrency=10)
        await limits.limiter.admit(t)
        store = limits._store
        assert store is not None
        sent = store.batcher.batches
        os.kill(redis_server.proc.pid, signal.SIGSTOP)
        try:
            first = asyncio.ensure_future(limits.limiter.admit(t))
            await wait_for(lambda: store.batcher.batches > sent)  # the first batch is in flight
            behind = [asyncio.ensure_future(limits.limiter.admit(t)) for _ in range(3)]
            outcomes = await asyncio.gather(first, *behind, return_exceptions=True)
        finally:
            os.kill(redis_server.proc.pid, signal.SIGCONT)
        assert all(isinstance(o, unavailable_errors()) for o in outcomes), outcomes
        assert store.batcher.batches == sent + 1
    finally:
        await limits.aclose()
