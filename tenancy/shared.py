"""Tenant limits and the token ledger shared by several gateway instances through Redis (issue 16).

The in-process classes (:class:`tenancy.limits.TenantLimiter`,
:class:`tenancy.ledger.InProcessLedger`) hold one instance's view; run N
instances and every tenant gets N times its limits. This module keeps the
same state in Redis, changed only by atomic Lua scripts (registered with
:meth:`redis.asyncio.Redis.register_script`, run with ``EVALSHA``), so any
number of instances share one bucket per tenant.

**Same semantics as in process.** Every script performs exactly the
arithmetic of :class:`tenancy.limits.TokenBucket` (capacity ``burst``,
refill ``rate`` per second, reconfiguration keeping the level, debt where the
in-process code allows it) and of :class:`tenancy.ledger.InProcessLedger`
(both buckets checked, then taken together; refunds capped at the burst;
charges beyond a reservation as debt on the stored level), with IEEE doubles
stored as ``%.17g`` strings, so the same operations at the same ``now`` give
the same levels (tests/scaleout/test_i16_shared_limits.py compares them).

**Time.** ``now`` defaults to the Redis server's clock (``TIME``), one clock
for every instance; an explicit ``now`` (seconds) is for tests. Lease expiry
always uses the server clock.

**Keys** (``P`` = ``state.key_prefix``; ``{t:ID}`` is a hash tag, so one
tenant's keys stay in one Redis Cluster slot)::

    P{t:ID}:req       hash  request bucket (level, updated, rate, burst)
    P{t:ID}:ptok      hash  prompt-token bucket of the limiter
    P{t:ID}:conc      zset  concurrency slots: member "<lease id>#<i>", score = expiry (ms, server clock)
    P{t:ID}:led:ptok  hash  prompt-token bucket of the ledger
    P{t:ID}:led:otok  hash  output-token bucket of the ledger
    P{t:ID}:led:tot   hash  ledger totals (reserved_/charged_/refunded_ prompt|output, open)
    P ledger:tenants  set   tenant ids with ledger totals

Bucket keys expire one hour after the time they would be full again (an
absent bucket is a full one). Only numbers and tenant ids are stored: no
prompt text, token or secret.

**Concurrency leases.** A slot is a sorted-set member scored by its expiry
(``state.lease_ttl_s`` <= 10 s from the last renewal); every script first
prunes expired members, so an instance that crashed (SIGKILL, lost host)
leaves no phantom slot beyond the TTL. A live instance renews all its
leases every ``ttl/3`` (:meth:`RedisTenantLimiter.start` runs the renewer);
a slot whose renewal came too late is lost (counted in
``lost_slots``) and the request goes on.

**Never block the end of a request.** :meth:`SharedLease.release`,
:meth:`RedisReservation.lower_output` and :meth:`RedisReservation.settle`
are synchronous, as in the in-process interface (tenancy/ledger.py: "a
shared-store implementation must queue settlements"): they compute their
result at once and queue the Redis update on a FIFO drained by one task
(:class:`_Writer`); :meth:`SharedLimits.flush` waits for it. Admission
(:meth:`RedisTenantLimiter.admit`, :meth:`RedisLedger.reserve`) is
``async``: it needs Redis's answer. :func:`make_limits` returns the same
async interface for both backends (:class:`InProcessLimits` wraps the
in-process classes).

**Not yet**: the gateway's admission path (gateway/components.py) still
calls the in-process classes synchronously; behaviour when Redis is
unreachable (fail closed with 503 or local limits scaled by 1/N) is the
caller's, not implemented here (a Redis error propagates as
:class:`redis.exceptions.RedisError` from the async methods; queued updates
are retried).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import secrets
import stat
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tenancy.ledger import InProcessLedger, LedgerReservation, LedgerTotals, Reservation, Settlement
from tenancy.limits import ConcurrencyLimited, Lease, RateLimited, TenantLimiter
from tenancy.registry import Tenant

__all__ = [
    "InProcessLimits",
    "RedisLedger",
    "RedisReservation",
    "RedisTenantLimiter",
    "SharedLease",
    "SharedLimits",
    "StateSetupError",
    "make_limits",
    "redis_client",
]

log = logging.getLogger("prefixgate.state")

_MAX_PASSWORD_BYTES = 4096

# --- Lua ---------------------------------------------------------------------------------------

# Shared helpers: a bucket is a hash {level, updated, rate, burst}; numbers travel as %.17g strings
# (exact doubles; a Lua number returned as a reply would be truncated to an integer).
_LUA_LIB = r"""
local function num(x) return string.format('%.17g', x) end
local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6, tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- TokenBucket(rate, burst, now) or the stored one, reconfigured (refill at the old rate, capped at the
-- old burst, then capped at the new one) and refilled to now, exactly as tenancy/limits.py
local function load(key, rate, burst, now)
  local v = redis.call('HMGET', key, 'level', 'updated', 'rate', 'burst')
  if not v[1] then return burst, now end
  local level, updated = tonumber(v[1]), tonumber(v[2])
  local orate, oburst = tonumber(v[3]), tonumber(v[4])
  if now > updated then
    level = math.min(oburst, level + (now - updated) * orate)
    updated = now
  end
  if orate ~= rate or oburst ~= burst then level = math.min(level, burst) end
  return level, updated
end
local function bucket_ttl_ms(level, rate, burst)
  local full_s = 0
  if level < burst then full_s = (burst - level) / rate end
  return math.floor((full_s + 3600) * 1000)
end
local function store(key, level, updated, rate, burst)
  redis.call('HSET', key, 'level', num(level), 'updated', num(updated), 'rate', num(rate), 'burst', num(burst))
  redis.call('PEXPIRE', key, bucket_ttl_ms(level, rate, burst))
end
-- try_take: need < 0 means "can never succeed" (n > burst without debt); returns wait seconds (0: taken)
local function take(key, rate, burst, now, n, need)
  local level, updated = load(key, rate, burst, now)
  local wait = 0
  if need < 0 then wait = -1
  elseif level >= need then level = level - n
  else wait = (need - level) / rate end
  store(key, level, updated, rate, burst)
  return wait
end
local function wait_reply(reason, wait)
  if wait < 0 then return {reason, 'inf'} end
  return {reason, num(wait)}
end
"""

# KEYS: conc zset, request bucket. ARGV: now|'', max_conc (-1: none), rate|'' , burst, n, need,
# drop_unlimited (1: delete the bucket when rate is ''), lease_ttl_ms, member...
_LUA_ADMIT = _LUA_LIB + r"""
local now, now_ms = server_now()
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local maxc = tonumber(ARGV[2])
local members = #ARGV - 8
if maxc >= 0 and redis.call('ZCARD', KEYS[1]) + members > maxc then return {'concurrency', '1'} end
if ARGV[3] ~= '' then
  local wait = take(KEYS[2], tonumber(ARGV[3]), tonumber(ARGV[4]), now, tonumber(ARGV[5]), tonumber(ARGV[6]))
  if wait ~= 0 then return wait_reply('rate', wait) end
elseif ARGV[7] == '1' then
  redis.call('DEL', KEYS[2])
end
local ttl = tonumber(ARGV[8])
for i = 9, #ARGV do redis.call('ZADD', KEYS[1], now_ms + ttl, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], ttl * 3)
return {'ok', '0'}
"""

# KEYS: conc zset. ARGV: lease_ttl_ms, member... Returns how many members were still held.
_LUA_RENEW = _LUA_LIB + r"""
local now, now_ms = server_now()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local ttl = tonumber(ARGV[1])
local held = 0
for i = 2, #ARGV do held = held + redis.call('ZADD', KEYS[1], 'XX', 'CH', now_ms + ttl, ARGV[i]) end
if held > 0 then redis.call('PEXPIRE', KEYS[1], ttl * 3) end
return held
"""

# KEYS: conc zset. Returns the live slot count (expired ones pruned).
_LUA_COUNT = _LUA_LIB + r"""
local now, now_ms = server_now()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
return redis.call('ZCARD', KEYS[1])
"""

# KEYS: bucket. ARGV: now|'', rate, burst, n, need.
_LUA_TAKE = _LUA_LIB + r"""
local now = server_now()
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) end
local wait = take(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]), now, tonumber(ARGV[4]), tonumber(ARGV[5]))
if wait ~= 0 then return wait_reply('rate', wait) end
return {'ok', '0'}
"""

# KEYS: bucket. ARGV: now|''. The level refilled to now, stored like TokenBucket.refill does (the
# in-process ledger applies later debts and refunds to the stored level, so a read that refills
# must store, or the two would differ). Returns false for no bucket.
_LUA_LEVEL = _LUA_LIB + r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
local now = server_now()
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) end
local v = redis.call('HMGET', KEYS[1], 'rate', 'burst')
local rate, burst = tonumber(v[1]), tonumber(v[2])
local level, updated = load(KEYS[1], rate, burst, now)
store(KEYS[1], level, updated, rate, burst)
return num(level)
"""

# KEYS: prompt bucket, output bucket, totals, tenants set.
# ARGV: now|'', prate|'', pburst, p, orate|'', oburst, o, tenant id
_LUA_RESERVE = _LUA_LIB + r"""
local now = server_now()
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) end
redis.call('SADD', KEYS[4], ARGV[8])
local specs = {{KEYS[1], ARGV[2], ARGV[3], ARGV[4], 'tenant_prompt_tokens'},
               {KEYS[2], ARGV[5], ARGV[6], ARGV[7], 'tenant_output_tokens'}}
local levels = {}
local maxwait, reason = 0, nil
for i, s in ipairs(specs) do
  if s[2] == '' then
    redis.call('DEL', s[1])
  else
    local rate, burst, n = tonumber(s[2]), tonumber(s[3]), tonumber(s[4])
    local level, updated = load(s[1], rate, burst, now)
    store(s[1], level, updated, rate, burst)
    levels[i] = {level, updated, rate, burst, n}
    local need = math.min(n, burst)
    if level < need then
      local wait = (need - level) / rate
      if reason == nil then reason = s[5] end
      if wait > maxwait then maxwait = wait end
    end
  end
end
if reason ~= nil then return {reason, num(maxwait)} end
for i, s in ipairs(specs) do
  local b = levels[i]
  if b then store(s[1], b[1] - b[5], b[2], b[3], b[4]) end
end
redis.call('HINCRBY', KEYS[3], 'reserved_prompt', ARGV[4])
redis.call('HINCRBY', KEYS[3], 'reserved_output', ARGV[7])
redis.call('HINCRBY', KEYS[3], 'open', 1)
return {'ok', '0'}
"""

# KEYS: prompt bucket, output bucket, totals. ARGV: d_prompt, d_output, mode (lower|settle),
# charged_prompt, charged_output, refunded_prompt, refunded_output.
# tenancy/ledger.py InProcessLedger._adjust: on the stored level, no refill; debt or a capped refund.
_LUA_ADJUST = _LUA_LIB + r"""
local deltas = {tonumber(ARGV[1]), tonumber(ARGV[2])}
for i = 1, 2 do
  local d = deltas[i]
  if d ~= 0 and redis.call('EXISTS', KEYS[i]) == 1 then
    local v = redis.call('HMGET', KEYS[i], 'level', 'updated', 'rate', 'burst')
    local level, rate, burst = tonumber(v[1]), tonumber(v[3]), tonumber(v[4])
    if d > 0 then level = level - d else level = math.min(burst, level - d) end
    store(KEYS[i], level, tonumber(v[2]), rate, burst)
  end
end
if ARGV[3] == 'lower' then
  redis.call('HINCRBY', KEYS[3], 'refunded_output', -deltas[2])
  return 1
end
local open = tonumber(redis.call('HGET', KEYS[3], 'open') or '0')
redis.call('HSET', KEYS[3], 'open', math.max(0, open - 1))
redis.call('HINCRBY', KEYS[3], 'charged_prompt', ARGV[4])
redis.call('HINCRBY', KEYS[3], 'charged_output', ARGV[5])
redis.call('HINCRBY', KEYS[3], 'refunded_prompt', ARGV[6])
redis.call('HINCRBY', KEYS[3], 'refunded_output', ARGV[7])
return 1
"""


def _arg(x: float | None) -> str:
    """A number as a script argument (``''`` for None), exact for doubles."""
    return "" if x is None else repr(float(x))


def _wait(reply: list[Any]) -> tuple[str, float]:
    reason = reply[0].decode() if isinstance(reply[0], bytes) else str(reply[0])
    raw = reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])
    return reason, (math.inf if raw == "inf" else float(raw))


class StateSetupError(Exception):
    """The ``state`` configuration cannot be used (password file unsafe, variable unset)."""


# --- the background writer -------------------------------------------------------------------


class _Writer:
    """FIFO of Redis updates that must not block their caller (releases, settlements).

    One task drains it in order; a failed update is retried (backoff up to
    1 s) until it succeeds or the writer is closed. ``pending`` counts
    queued updates.
    """

    def __init__(self) -> None:
        self._queue: deque[Callable[[], Any]] = deque()
        self._event = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._task: asyncio.Task[None] | None = None
        self.failures = 0

    @property
    def pending(self) -> int:
        """Updates queued and not yet applied."""
        return len(self._queue)

    def submit(self, op: Callable[[], Any]) -> None:
        """Queue ``op`` (a coroutine function); starts the drain task on first use."""
        self._queue.append(op)
        self._idle.clear()
        self._event.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="prefixgate-state-writer")

    async def _run(self) -> None:
        backoff = 0.05
        while True:
            if not self._queue:
                self._idle.set()
                self._event.clear()
                await self._event.wait()
                continue
            op = self._queue[0]
            try:
                await op()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis down: retry, never drop silently
                self.failures += 1
                log.warning("shared state update failed (%s); retrying", exc.__class__.__name__)
                await asyncio.sleep(backoff)
                backoff = min(1.0, backoff * 2)
                continue
            backoff = 0.05
            self._queue.popleft()

    async def flush(self) -> None:
        """Wait until every queued update is applied."""
        await self._idle.wait()

    async def aclose(self) -> None:
        """Stop the drain task (queued updates not yet applied are dropped; leases then expire)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


class _Store:
    """The client, key prefix, registered scripts and writer of one instance."""

    def __init__(self, client: Any, key_prefix: str, lease_ttl_s: float) -> None:
        if not 0 < lease_ttl_s <= 10:
            raise ValueError("lease_ttl_s must be in (0, 10]")
        self.client = client
        self.prefix = key_prefix
        self.lease_ttl_ms = max(1, int(lease_ttl_s * 1000))
        self.admit = client.register_script(_LUA_ADMIT)
        self.renew = client.register_script(_LUA_RENEW)
        self.count = client.register_script(_LUA_COUNT)
        self.take = client.register_script(_LUA_TAKE)
        self.reserve = client.register_script(_LUA_RESERVE)
        self.adjust = client.register_script(_LUA_ADJUST)
        self.level = client.register_script(_LUA_LEVEL)
        self.writer = _Writer()

    def key(self, tenant_id: str, name: str) -> str:
        """``<prefix>{t:<tenant>}:<name>``."""
        return f"{self.prefix}{{t:{tenant_id}}}:{name}"


# --- limiter ------------------------------------------------------------------------------------


class SharedLease:
    """An admitted request's concurrency slots in Redis (``weight`` members of the tenant's set).

    :meth:`release` is synchronous and idempotent (queues the ``ZREM``);
    usable as ``with`` or ``async with``, like :class:`tenancy.limits.Lease`.
    """

    __slots__ = ("_limiter", "_done", "id", "tenant_id", "weight")

    def __init__(self, limiter: RedisTenantLimiter, tenant_id: str, lease_id: str) -> None:
        self._limiter = limiter
        self._done = False
        self.id = lease_id
        self.tenant_id = tenant_id
        self.weight = 1

    def members(self, start: int = 0, stop: int | None = None) -> list[str]:
        """Sorted-set members of slots ``start`` .. ``stop`` (default: all held)."""
        return [f"{self.id}#{i}" for i in range(start, self.weight if stop is None else stop)]

    @property
    def released(self) -> bool:
        """True once :meth:`release` has run."""
        return self._done

    def release(self) -> None:
        """Free the slots (queued; later calls do nothing)."""
        if not self._done:
            self._done = True
            self._limiter._release(self)

    def __enter__(self) -> SharedLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    async def __aenter__(self) -> SharedLease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class RedisTenantLimiter:
    """:class:`tenancy.limits.TenantLimiter` over Redis: one request bucket, prompt-token bucket and
    concurrency count per tenant for all instances sharing the store.

    Same methods as the in-process limiter, ``async`` where Redis must
    answer. Raises :class:`~tenancy.limits.ConcurrencyLimited` /
    :class:`~tenancy.limits.RateLimited` with the same reasons and
    ``retry_after_s``; a refused request takes nothing. Redis errors
    propagate (:class:`redis.exceptions.RedisError`).
    """

    def __init__(self, store: _Store) -> None:
        self._s = store
        self._leases: dict[str, SharedLease] = {}
        self._renewer: asyncio.Task[None] | None = None
        #: slots found expired when renewed (their request went on without a slot)
        self.lost_slots = 0
        #: completed :meth:`renew` calls
        self.renewals = 0

    async def admit(self, tenant: Tenant, now: float | None = None) -> SharedLease:
        """Admit one request of ``tenant``; return its :class:`SharedLease` (see TenantLimiter.admit)."""
        lease = SharedLease(self, tenant.id, secrets.token_hex(8))
        rate = tenant.rate_rps
        burst = (tenant.rate_burst or max(1.0, rate)) if rate is not None else None
        need = -1.0 if (burst is not None and 1 > burst) else 1.0
        reply = await self._s.admit(
            keys=[self._s.key(tenant.id, "conc"), self._s.key(tenant.id, "req")],
            args=[_arg(now), -1 if tenant.max_concurrency is None else tenant.max_concurrency,
                  _arg(rate), _arg(burst), "1", _arg(need), "1", self._s.lease_ttl_ms, *lease.members()])
        self._raise(reply, "tenant_request_rate")
        self._leases[lease.id] = lease
        return lease

    async def add_sequences(self, tenant: Tenant, lease: SharedLease, extra: int, now: float | None = None) -> None:
        """Charge ``extra`` more sequences of an admitted batch (see TenantLimiter.add_sequences)."""
        if extra <= 0 or lease.released:
            return
        rate = tenant.rate_rps
        burst = (tenant.rate_burst or max(1.0, rate)) if rate is not None else None
        # TokenBucket.try_take(extra, allow_debt=True, need=min(extra, max(0, burst - 1))): need <= burst
        need = min(float(extra), max(0.0, burst - 1)) if burst is not None else 0.0
        need = min(need, burst) if burst is not None else need
        reply = await self._s.admit(
            keys=[self._s.key(tenant.id, "conc"), self._s.key(tenant.id, "req")],
            args=[_arg(now), -1 if tenant.max_concurrency is None else tenant.max_concurrency,
                  _arg(rate), _arg(burst), _arg(extra), _arg(need), "0", self._s.lease_ttl_ms,
                  *lease.members(lease.weight, lease.weight + extra)])
        self._raise(reply, "tenant_request_rate")
        lease.weight += extra
        if lease.released:  # released while we waited: free the new slots too
            await self._s.client.zrem(self._s.key(tenant.id, "conc"),
                                      *lease.members(lease.weight - extra, lease.weight))

    async def charge_prompt_tokens(self, tenant: Tenant, n: int, now: float | None = None) -> None:
        """Charge ``n`` prompt tokens (see TenantLimiter.charge_prompt_tokens; debt allowed)."""
        if n < 0:
            raise ValueError("token count must be >= 0")
        rate = tenant.prompt_tokens_per_s
        if rate is None:
            return
        burst = tenant.prompt_tokens_burst or max(1.0, rate)
        reply = await self._s.take(keys=[self._s.key(tenant.id, "ptok")],
                                   args=[_arg(now), _arg(rate), _arg(burst), _arg(n), _arg(min(n, burst))])
        self._raise(reply, "tenant_prompt_tokens")

    async def in_flight(self, tenant_id: str) -> int:
        """Live concurrency slots of ``tenant_id`` across all instances (expired ones pruned)."""
        return int(await self._s.count(keys=[self._s.key(tenant_id, "conc")], args=[]))

    async def renew(self) -> int:
        """Extend every unreleased lease of this instance by the lease TTL; return the slots renewed
        (slots found expired already are counted in ``lost_slots``)."""
        by_tenant: dict[str, list[str]] = {}
        for lease in list(self._leases.values()):
            if not lease.released:
                by_tenant.setdefault(lease.tenant_id, []).extend(lease.members())
        renewed = 0
        for tid, members in by_tenant.items():
            held = int(await self._s.renew(keys=[self._s.key(tid, "conc")], args=[self._s.lease_ttl_ms, *members]))
            renewed += held
            self.lost_slots += len(members) - held
        self.renewals += 1
        return renewed

    def start(self) -> None:
        """Start renewing this instance's leases every ``lease_ttl/3`` (call from the event loop)."""
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop(), name="prefixgate-lease-renewer")

    async def _renew_loop(self) -> None:
        interval = self._s.lease_ttl_ms / 3000
        while True:
            await asyncio.sleep(interval)
            try:
                await self.renew()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis down: the slots expire, retry next tick
                log.warning("lease renewal failed (%s)", exc.__class__.__name__)

    async def aclose(self) -> None:
        """Stop the renewer (leases not released expire after the TTL)."""
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
            self._renewer = None

    def _release(self, lease: SharedLease) -> None:
        self._leases.pop(lease.id, None)
        key, members = self._s.key(lease.tenant_id, "conc"), lease.members()
        self._s.writer.submit(lambda: self._s.client.zrem(key, *members))

    @staticmethod
    def _raise(reply: list[Any], rate_reason: str) -> None:
        kind, wait = _wait(reply)
        if kind == "ok":
            return
        if kind == "concurrency":
            raise ConcurrencyLimited(1.0, "tenant_concurrency")
        raise RateLimited(wait, rate_reason)


# --- ledger -------------------------------------------------------------------------------------


class RedisReservation(LedgerReservation):
    """A reservation held in Redis buckets; :meth:`settle` / :meth:`lower_output` queue their update
    (synchronous, never block; see the module doc)."""

    def __init__(self, ledger: RedisLedger, tenant_id: str, prompt: int, output: int) -> None:
        super().__init__(tenant_id, prompt, output)
        self._ledger = ledger

    def _apply(self, d_prompt: int, d_output: int, settled: Settlement | None) -> None:
        self._ledger._adjust(self.tenant_id, d_prompt, d_output, "lower" if settled is None else "settle", settled)


class RedisLedger:
    """:class:`tenancy.ledger.InProcessLedger` over Redis, shared by every instance of the store.

    :meth:`reserve` is ``async`` (Redis decides); the returned
    :class:`RedisReservation` has the synchronous ``lower_output`` /
    ``settle`` of :class:`tenancy.ledger.Reservation`, whose updates are
    queued in order. :meth:`totals` and :meth:`level` read Redis (call
    :meth:`SharedLimits.flush` first to see queued updates).
    """

    def __init__(self, store: _Store) -> None:
        self._s = store

    async def reserve(self, tenant: Tenant, prompt_tokens: int, output_tokens: int,
                      now: float | None = None) -> RedisReservation:
        """See :meth:`tenancy.ledger.TokenLedger.reserve` (same errors and reasons)."""
        if prompt_tokens < 0 or output_tokens < 0:
            raise ValueError("token count must be >= 0")
        pr, ore = tenant.prompt_tokens_per_s, tenant.output_tokens_per_s
        pb = None if pr is None else (tenant.prompt_tokens_burst if tenant.prompt_tokens_burst is not None
                                      else max(1.0, pr))
        ob = None if ore is None else (tenant.output_tokens_burst if tenant.output_tokens_burst is not None
                                       else max(1.0, ore))
        s = self._s
        reply = await s.reserve(
            keys=[s.key(tenant.id, "led:ptok"), s.key(tenant.id, "led:otok"), s.key(tenant.id, "led:tot"),
                  f"{s.prefix}ledger:tenants"],
            args=[_arg(now), _arg(pr), _arg(pb), prompt_tokens, _arg(ore), _arg(ob), output_tokens, tenant.id])
        reason, wait = _wait(reply)
        if reason != "ok":
            raise RateLimited(wait, reason)
        return RedisReservation(self, tenant.id, prompt_tokens, output_tokens)

    async def totals(self) -> Mapping[str, LedgerTotals]:
        """Per-tenant totals across all instances, by tenant id."""
        s = self._s
        out: dict[str, LedgerTotals] = {}
        for raw in sorted(await s.client.smembers(f"{s.prefix}ledger:tenants")):
            tid = raw.decode() if isinstance(raw, bytes) else raw
            h = {(k.decode() if isinstance(k, bytes) else k): int(v)
                 for k, v in (await s.client.hgetall(s.key(tid, "led:tot"))).items()}
            out[tid] = LedgerTotals(
                {"prompt": h.get("reserved_prompt", 0), "output": h.get("reserved_output", 0)},
                {"prompt": h.get("charged_prompt", 0), "output": h.get("charged_output", 0)},
                {"prompt": h.get("refunded_prompt", 0), "output": h.get("refunded_output", 0)},
                h.get("open", 0))
        return out

    async def level(self, tenant_id: str, kind: str, now: float | None = None) -> float | None:
        """Level of a tenant's ``prompt`` / ``output`` bucket refilled to ``now`` (None: no bucket).

        Refills the stored bucket as :meth:`tenancy.ledger.InProcessLedger.level` does."""
        key = self._s.key(tenant_id, "led:ptok" if kind == "prompt" else "led:otok")
        raw = await self._s.level(keys=[key], args=[_arg(now)])
        return None if raw is None else float(raw)

    def _adjust(self, tenant_id: str, d_prompt: int, d_output: int, mode: str, s: Settlement | None) -> None:
        st = self._s
        keys = [st.key(tenant_id, "led:ptok"), st.key(tenant_id, "led:otok"), st.key(tenant_id, "led:tot")]
        args = [d_prompt, d_output, mode]
        if s is not None:
            args += [s.charged_prompt, s.charged_output, s.refunded_prompt, s.refunded_output]
        else:
            args += [0, 0, 0, 0]
        st.writer.submit(lambda: st.adjust(keys=keys, args=args))


# --- the factory --------------------------------------------------------------------------------


@dataclass
class SharedLimits:
    """What :func:`make_limits` returns: ``limiter`` and ``ledger`` with the async interface.

    ``backend``: ``memory`` or ``redis``. :meth:`start` (in the event
    loop) starts lease renewal; :meth:`flush` waits for queued updates;
    :meth:`aclose` stops background work and closes the client.
    """

    backend: str
    limiter: Any
    ledger: Any
    _store: _Store | None = None
    _owns_client: bool = False

    def start(self) -> None:
        """Start background work (lease renewal); no-op for ``memory``."""
        if isinstance(self.limiter, RedisTenantLimiter):
            self.limiter.start()

    async def flush(self) -> None:
        """Wait until queued releases and settlements are applied (no-op for ``memory``)."""
        if self._store is not None:
            await self._store.writer.flush()

    async def aclose(self) -> None:
        """Stop renewal and the writer (after a flush); close the client if this object made it."""
        if isinstance(self.limiter, RedisTenantLimiter):
            await self.limiter.aclose()
        if self._store is not None:
            await self._store.writer.aclose()
            if self._owns_client:
                await self._store.client.aclose()


class InProcessLimits:
    """The in-process limiter and ledger behind the async interface of the Redis ones."""

    class Limiter:
        """:class:`tenancy.limits.TenantLimiter` with ``async`` admission methods."""

        def __init__(self, inner: TenantLimiter) -> None:
            self.inner = inner

        async def admit(self, tenant: Tenant, now: float | None = None) -> Lease:
            """See :meth:`tenancy.limits.TenantLimiter.admit`."""
            return self.inner.admit(tenant, now)

        async def add_sequences(self, tenant: Tenant, lease: Lease, extra: int, now: float | None = None) -> None:
            """See :meth:`tenancy.limits.TenantLimiter.add_sequences`."""
            self.inner.add_sequences(tenant, lease, extra, now)

        async def charge_prompt_tokens(self, tenant: Tenant, n: int, now: float | None = None) -> None:
            """See :meth:`tenancy.limits.TenantLimiter.charge_prompt_tokens`."""
            self.inner.charge_prompt_tokens(tenant, n, now)

        async def in_flight(self, tenant_id: str) -> int:
            """See :meth:`tenancy.limits.TenantLimiter.in_flight`."""
            return self.inner.in_flight(tenant_id)

    class Ledger:
        """:class:`tenancy.ledger.InProcessLedger` with ``async`` ``reserve`` / ``totals`` / ``level``."""

        def __init__(self, inner: InProcessLedger) -> None:
            self.inner = inner

        async def reserve(self, tenant: Tenant, prompt_tokens: int, output_tokens: int,
                          now: float | None = None) -> Reservation:
            """See :meth:`tenancy.ledger.TokenLedger.reserve`."""
            return self.inner.reserve(tenant, prompt_tokens, output_tokens, now)

        async def totals(self) -> Mapping[str, LedgerTotals]:
            """See :meth:`tenancy.ledger.TokenLedger.totals`."""
            return self.inner.totals()

        async def level(self, tenant_id: str, kind: str, now: float | None = None) -> float | None:
            """See :meth:`tenancy.ledger.InProcessLedger.level`."""
            return self.inner.level(tenant_id, kind, now)


def _read_password_file(path: str) -> str:
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise StateSetupError(f"state.password_file {path!r} cannot be opened: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StateSetupError(f"state.password_file {path!r} is not a regular file")
        if st.st_mode & 0o077:
            raise StateSetupError(f"state.password_file {path!r} is accessible by group/others "
                                  f"(mode {stat.S_IMODE(st.st_mode):04o}); chmod 600 it")
        data = os.read(fd, _MAX_PASSWORD_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > _MAX_PASSWORD_BYTES:
        raise StateSetupError(f"state.password_file {path!r} is larger than {_MAX_PASSWORD_BYTES} bytes")
    return data.decode("utf-8").rstrip("\r\n")


def redis_client(cfg: Any) -> Any:
    """A :class:`redis.asyncio.Redis` for a ``state`` config (:class:`gateway.config.StateConfig`).

    ``url``; ``username``; the password from ``password_file`` (mode 0600,
    checked) or the variable ``password_env``; ``tls_ca_file`` verifies a
    ``rediss://`` server. Raises :class:`StateSetupError` (messages never
    hold the password). Connects lazily (the first command).
    """
    import redis.asyncio as aioredis

    if not cfg.url:
        raise StateSetupError("state.url is required when state.backend is redis")
    password = None
    if cfg.password_file:
        password = _read_password_file(cfg.password_file)
    elif cfg.password_env:
        password = os.environ.get(cfg.password_env)
        if not password:
            raise StateSetupError(f"state.password_env: environment variable {cfg.password_env!r} is not set")
    kwargs: dict[str, Any] = {}
    if cfg.username:
        kwargs["username"] = cfg.username
    if password is not None:
        kwargs["password"] = password
    if cfg.tls_ca_file:
        kwargs["ssl_ca_certs"] = cfg.tls_ca_file
        kwargs["ssl_cert_reqs"] = "required"
    return aioredis.Redis.from_url(cfg.url, **kwargs)


def make_limits(cfg: Any, *, client: Any = None) -> SharedLimits:
    """Build the tenant limiter and token ledger of a ``state`` config (async interface for both).

    ``cfg``: :class:`gateway.config.StateConfig`. ``memory``: the
    in-process classes wrapped by :class:`InProcessLimits`; ``redis``:
    :class:`RedisTenantLimiter` and :class:`RedisLedger` on ``client``
    (default: :func:`redis_client` of ``cfg``, closed by
    :meth:`SharedLimits.aclose`). Call :meth:`SharedLimits.start` in the
    event loop. Raises :class:`StateSetupError`.
    """
    if cfg.backend == "memory":
        return SharedLimits("memory", InProcessLimits.Limiter(TenantLimiter()),
                            InProcessLimits.Ledger(InProcessLedger()))
    owns = client is None
    if client is None:
        client = redis_client(cfg)
    store = _Store(client, cfg.key_prefix, cfg.lease_ttl_s)
    return SharedLimits("redis", RedisTenantLimiter(store), RedisLedger(store), store, owns)
