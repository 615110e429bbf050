"""Tenant request rate, prompt-token rate and concurrency shared by all instances through Redis
(issue 16): :class:`RedisTenantLimiter` and its :class:`SharedLease`.

Same semantics as :class:`tenancy.limits.TenantLimiter` (tests compare them),
``async`` where Redis must answer; the lease release is synchronous and queued.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
import time
from typing import Any

from tenancy.limits import ConcurrencyLimited, RateLimited, ReleasedOnExit
from tenancy.prompt_room import PromptRoom, shared_room
from tenancy.registry import Tenant
from tenancy.shared_lua import arg as _arg
from tenancy.shared_lua import int_reply as _int
from tenancy.shared_lua import malformed as _malformed
from tenancy.shared_lua import wait_reply as _wait
from tenancy.shared_store import Store, cancel_task

__all__ = ["RedisTenantLimiter", "SharedLease"]

log = logging.getLogger("prefixgate.state")

# --- limiter ------------------------------------------------------------------------------------


class SharedLease(ReleasedOnExit):
    """An admitted request's concurrency slots in Redis (``weight`` members of the tenant's set).

    :meth:`release` is synchronous and idempotent (queues the ``ZREM``);
    usable as ``with`` or ``async with``, like :class:`tenancy.limits.Lease`.
    """

    __slots__ = ("_limiter", "id", "prompt_bucket", "tenant_id", "weight")

    def __init__(self, limiter: RedisTenantLimiter, tenant_id: str, lease_id: str) -> None:
        super().__init__()
        self._limiter = limiter
        self.id = lease_id
        self.tenant_id = tenant_id
        self.weight = 1
        #: the shared ledger prompt-token bucket read by the admit script: (level, rate, burst,
        #: ``time.monotonic()`` at the reply), None when the tenant had no such bucket (a full one)
        self.prompt_bucket: tuple[float, float, float, float] | None = None

    def prompt_room(self, tenant: Tenant) -> PromptRoom | None:
        """What the shared prompt-token bucket admits now, from the level read at admission
        (:func:`tenancy.prompt_room.shared_room`); None: any prompt (no limit, full or absent bucket)."""
        b = self.prompt_bucket
        return None if b is None else shared_room(tenant, b[0], b[1], b[2], time.monotonic() - b[3])

    def members(self, start: int = 0, stop: int | None = None) -> list[str]:
        """Sorted-set members of slots ``start`` .. ``stop`` (default: all held)."""
        return [f"{self.id}#{i}" for i in range(start, self.weight if stop is None else stop)]

    def _free(self) -> None:  # queued: release() never waits on Redis
        self._limiter._release(self)


class RedisTenantLimiter:
    """:class:`tenancy.limits.TenantLimiter` over Redis: one request bucket, prompt-token bucket and
    concurrency count per tenant for all instances sharing the store.

    Same methods as the in-process limiter, ``async`` where Redis must
    answer. Raises :class:`~tenancy.limits.ConcurrencyLimited` /
    :class:`~tenancy.limits.RateLimited` with the same reasons and
    ``retry_after_s``; a refused request takes nothing. Redis errors
    propagate (:class:`redis.exceptions.RedisError`).
    """

    def __init__(self, store: Store) -> None:
        self._s = store
        self._leases: dict[str, SharedLease] = {}
        # lease ids: a random 12-hex prefix per limiter (unique across instances and restarts) and a
        # counter; session 8: one urandom system call per admission was a few µs of it
        self._id_prefix = secrets.token_hex(6)
        self._id_next = itertools.count()
        self._renewer: asyncio.Task[None] | None = None
        #: slots found expired when renewed (their request went on without a slot)
        self.lost_slots = 0
        #: completed :meth:`renew` calls
        self.renewals = 0

    async def admit(self, tenant: Tenant, now: float | None = None, *, slot: bool = True) -> SharedLease:
        """Admit one request of ``tenant``; return its :class:`SharedLease` (see TenantLimiter.admit;
        ``slot=False``: the request unit only, the slot comes with :meth:`take_slots`)."""
        lease = SharedLease(self, tenant.id, f"{self._id_prefix}{next(self._id_next):x}")
        if not slot:
            lease.weight = 0
        rate = tenant.rate_rps
        burst = (tenant.rate_burst or max(1.0, rate)) if rate is not None else None
        need = -1.0 if (burst is not None and 1 > burst) else 1.0
        maxc = -1 if tenant.max_concurrency is None or not slot else tenant.max_concurrency
        keys = [self._s.key(tenant.id, "conc"), self._s.key(tenant.id, "req")]
        if tenant.prompt_tokens_per_s is not None:  # the early check reads it (shared_room); else no HMGET
            keys.append(self._s.key(tenant.id, "led:ptok"))
        reply = await self._s.admit(
            keys=keys,
            args=[_arg(now), maxc, _arg(rate), _arg(burst), "1", _arg(need), "1", self._s.lease_ttl_ms,
                  *lease.members()])
        self._raise(reply, "tenant_request_rate")
        if len(reply) >= 5:  # the ledger's prompt-token bucket, same round trip (early debt check)
            lease.prompt_bucket = (float(reply[2]), float(reply[3]), float(reply[4]), time.monotonic())
        self._leases[lease.id] = lease
        return lease

    def take_slots_now(self, tenant: Tenant, lease: SharedLease, n: int) -> None:
        """None: a Redis slot needs Redis's answer (:meth:`take_slots`); the failover wrapper's
        local leases answer at once."""
        return None

    async def take_slots(self, tenant: Tenant, lease: SharedLease, n: int) -> None:
        """Take ``n`` concurrency slots for ``lease`` (see TenantLimiter.take_slots): the slot script
        (``tenancy.shared_lua.SLOT``), so only the tenant's slot count is checked and added to."""
        if n <= 0 or lease.released:
            return
        maxc = -1 if tenant.max_concurrency is None else tenant.max_concurrency
        reply = await self._s.slot(
            keys=[self._s.key(tenant.id, "conc")],
            args=[maxc, self._s.lease_ttl_ms, *lease.members(lease.weight, lease.weight + n)])
        self._raise(reply, "tenant_request_rate")
        lease.weight += n
        if lease.released:  # released while we waited: free the new slots too
            await self._s.client.zrem(self._s.key(tenant.id, "conc"), *lease.members(lease.weight - n, lease.weight))

    async def add_sequences(self, tenant: Tenant, lease: SharedLease, extra: int, now: float | None = None, *,
                            slots: bool = True) -> None:
        """Charge ``extra`` more sequences of an admitted batch (see TenantLimiter.add_sequences)."""
        if extra <= 0 or lease.released:
            return
        if not slots:  # the request units only: TenantLimiter's bucket arithmetic, no members
            rate = tenant.rate_rps
            if rate is None:
                return
            burst = tenant.rate_burst or max(1.0, rate)
            need = min(min(float(extra), max(0.0, burst - 1)), burst)
            reply = await self._s.take(keys=[self._s.key(tenant.id, "req")],
                                       args=[_arg(now), _arg(rate), _arg(burst), _arg(extra), _arg(need)])
            self._raise(reply, "tenant_request_rate")
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
        return _int(await self._s.count(keys=[self._s.key(tenant_id, "conc")], args=[]))

    async def renew(self) -> int:
        """Extend every unreleased lease of this instance by the lease TTL; return the slots renewed
        (slots found expired already are counted in ``lost_slots``).

        Each tenant is renewed on its own: a lost or malformed reply for one tenant (the script may
        have run) still queues the release of its leases released during the round trip, and the
        other tenants are renewed (R17-4); the first such error is raised after all of them.

        Raises:
            redis.exceptions.RedisError: a tenant's renewal failed (the others were attempted).
        """
        by_tenant: dict[str, list[SharedLease]] = {}
        for lease in list(self._leases.values()):
            if not lease.released:
                by_tenant.setdefault(lease.tenant_id, []).append(lease)
        renewed = 0
        failed: Exception | None = None
        for tid, leases in by_tenant.items():
            members = [m for lease in leases for m in lease.members()]
            if not members:
                continue
            try:
                held = _int(await self._s.renew(keys=[self._s.key(tid, "conc")],
                                                args=[self._s.lease_ttl_ms, *members]), 0, len(members))
                renewed += held
                self.lost_slots += len(members) - held
            except Exception as exc:  # noqa: BLE001 - the next tenants still renew; raised below
                failed = failed or exc
            finally:  # S17-9: RENEW adds missing members back; one released meanwhile goes again
                for lease in leases:
                    if lease.released:
                        self._release(lease)
        if failed is not None:
            raise failed
        self.renewals += 1
        return renewed

    def start(self) -> None:
        """Start renewing this instance's leases every ``lease_ttl/3`` (call from the event loop)."""
        if self._renewer is None or self._renewer.done():
            self._renewer = asyncio.get_running_loop().create_task(self._renew_loop(), name="prefixgate-lease-renewer")

    async def check_eviction_policy(self) -> str | None:
        """Warn unless Redis's ``maxmemory-policy`` is ``noeviction`` (docs/scale-out.md, S17-9: an
        evicted slot set or bucket loosens every tenant's limits); return the policy, or None when
        the ACL user may not read it (``CONFIG GET``), which is logged once as a reminder."""
        try:
            policy = (await self._s.client.config_get("maxmemory-policy")).get("maxmemory-policy")
        except Exception as exc:  # noqa: BLE001 - NoPermissionError (ACL) or a Redis without CONFIG
            log.warning("cannot read Redis maxmemory-policy (%s): it must be noeviction (docs/scale-out.md)",
                        exc.__class__.__name__)
            return None
        policy = policy.decode() if isinstance(policy, bytes) else policy
        if policy != "noeviction":
            log.warning("Redis maxmemory-policy is %s, not noeviction: evicted state keys loosen tenant limits "
                        "(docs/scale-out.md)", policy)
        return policy

    async def _renew_loop(self) -> None:
        interval = self._s.lease_ttl_ms / 3000
        await self.check_eviction_policy()
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
            await cancel_task(self._renewer)
            self._renewer = None

    def _release(self, lease: SharedLease) -> None:
        self._leases.pop(lease.id, None)
        members = lease.members()
        if not members:  # admitted without a slot and never given one
            return
        self._s.writer.submit(self._s.update_keys(lease.tenant_id), ["r", len(members), *members])

    @staticmethod
    def _raise(reply: list[Any], rate_reason: str) -> None:
        """Raise the limit a verdict reply names; a malformed reply raises redis-py's
        ``InvalidResponse`` (Redis unavailable, S17-8: :func:`tenancy.shared_lua.wait_reply`)."""
        kind, wait = _wait(reply)
        if kind not in ("ok", "concurrency", "rate"):
            raise _malformed(f"reason {kind!r}")
        if kind == "ok":
            return
        if kind == "concurrency":
            raise ConcurrencyLimited(1.0, "tenant_concurrency")
        raise RateLimited(wait, rate_reason)

