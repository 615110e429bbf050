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

**Redis unreachable**: with ``failover=True`` (the gateway)
:func:`make_limits` wraps both in :mod:`tenancy.shared_failover`
(``state.on_unavailable``: fail closed with 503, or local limits divided by
``state.instances_expected``; recovery without restart). Without it a Redis
error propagates as :class:`redis.exceptions.RedisError` from the async
methods; queued updates are retried (bounded queue, drops counted).

Modules: :mod:`tenancy.shared_lua` (scripts), :mod:`tenancy.shared_store`
(client, writer), :mod:`tenancy.shared_limiter`, :mod:`tenancy.shared_ledger`,
:mod:`tenancy.shared_failover`; this one builds them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tenancy.ledger import InProcessLedger, LedgerTotals, Reservation
from tenancy.limits import ConcurrencyLimited, Lease, TenantLimiter
from tenancy.registry import Tenant
from tenancy.shared_failover import (
    Availability,
    FailoverLedger,
    FailoverLimiter,
    StateUnavailable,
)
from tenancy.shared_batch import ScriptBatcher
from tenancy.shared_ledger import RedisLedger, RedisReservation
from tenancy.shared_limiter import RedisTenantLimiter, SharedLease
from tenancy.shared_store import StateSetupError, Store, Writer, redis_client

__all__ = [
    "InProcessLimits",
    "RedisLedger",
    "RedisReservation",
    "RedisTenantLimiter",
    "SharedLease",
    "SharedLimits",
    "StateSetupError",
    "StateUnavailable",
    "make_limits",
    "redis_client",
]

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
    _store: Store | None = None
    _owns_client: bool = False
    #: whether Redis answers, and the ``state.on_unavailable`` behaviour (``failover=True`` only)
    availability: Availability | None = None

    @property
    def client(self) -> Any:
        """The Redis client (None for ``memory``)."""
        return None if self._store is None else self._store.client

    @property
    def writer(self) -> Writer | None:
        """The queue of releases and settlements (None for ``memory``)."""
        return None if self._store is None else self._store.writer

    @property
    def batcher(self) -> ScriptBatcher | None:
        """The script batcher of the request path (None for ``memory``): other non-blocking
        commands may ride its batches (:meth:`tenancy.shared_batch.ScriptBatcher.command`)."""
        return None if self._store is None else self._store.batcher

    def _redis_limiter(self) -> RedisTenantLimiter | None:
        lim = self.limiter.shared if isinstance(self.limiter, FailoverLimiter) else self.limiter
        return lim if isinstance(lim, RedisTenantLimiter) else None

    def start(self) -> None:
        """Start background work (lease renewal); no-op for ``memory``."""
        if (lim := self._redis_limiter()) is not None:
            lim.start()

    async def ping(self) -> None:
        """Raise unless Redis answers a ``PING`` (no-op for ``memory``)."""
        if self._store is not None:
            await self._store.client.ping()

    async def flush(self) -> None:
        """Wait until queued releases and settlements are applied (no-op for ``memory``)."""
        if self._store is not None:
            await self._store.writer.flush()

    async def aclose(self) -> None:
        """Stop renewal and the writer (after a flush); close the client if this object made it."""
        if (lim := self._redis_limiter()) is not None:
            await lim.aclose()
        if self.availability is not None:
            await self.availability.aclose()
        if self._store is not None:
            await self._store.writer.aclose()
            await self._store.batcher.aclose()
            if self._owns_client:
                await self._store.client.aclose()


class InProcessLimits:
    """The in-process limiter and ledger behind the async interface of the Redis ones."""

    class Limiter:
        """:class:`tenancy.limits.TenantLimiter` with ``async`` admission methods."""

        def __init__(self, inner: TenantLimiter) -> None:
            self.inner = inner

        async def admit(self, tenant: Tenant, now: float | None = None, *, slot: bool = True) -> Lease:
            """See :meth:`tenancy.limits.TenantLimiter.admit`."""
            return self.inner.admit(tenant, now, slot=slot)

        async def add_sequences(self, tenant: Tenant, lease: Lease, extra: int, now: float | None = None, *,
                                slots: bool = True) -> None:
            """See :meth:`tenancy.limits.TenantLimiter.add_sequences`."""
            self.inner.add_sequences(tenant, lease, extra, now, slots=slots)

        def take_slots_now(self, tenant: Tenant, lease: Lease, n: int) -> bool:
            """:meth:`tenancy.limits.TenantLimiter.take_slots` at once: True taken, False refused."""
            try:
                self.inner.take_slots(tenant, lease, n)
            except ConcurrencyLimited:
                return False
            return True

        async def take_slots(self, tenant: Tenant, lease: Lease, n: int) -> None:
            """See :meth:`tenancy.limits.TenantLimiter.take_slots`."""
            self.inner.take_slots(tenant, lease, n)

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


def make_limits(cfg: Any, *, client: Any = None, clock: Callable[[], float] | None = None,
                failover: bool = False, on_change: Callable[[bool], None] | None = None) -> SharedLimits:
    """Build the tenant limiter and token ledger of a ``state`` config (async interface for both).

    ``cfg``: :class:`gateway.config.StateConfig`. ``memory``: the
    in-process classes wrapped by :class:`InProcessLimits`; ``redis``:
    :class:`RedisTenantLimiter` and :class:`RedisLedger` on ``client``
    (default: :func:`redis_client` of ``cfg``, closed by
    :meth:`SharedLimits.aclose`). ``clock``: seconds for the ledger's
    reserve/settle times (default: the Redis server's clock; tests inject
    one). ``failover``: wrap both in :class:`FailoverLimiter` /
    :class:`FailoverLedger` (``cfg.on_unavailable``, ``cfg.instances_expected``,
    ``cfg.probe_interval_s``; ``on_change(available)`` on every change).
    Call :meth:`SharedLimits.start` in the event loop. Raises :class:`StateSetupError`.
    """
    if cfg.backend == "memory":
        return SharedLimits("memory", InProcessLimits.Limiter(TenantLimiter()),
                            InProcessLimits.Ledger(InProcessLedger()))
    owns = client is None
    if client is None:
        client = redis_client(cfg)
    store = Store(client, cfg.key_prefix, cfg.lease_ttl_s)
    limiter: Any = RedisTenantLimiter(store)
    ledger: Any = RedisLedger(store, clock)
    av = None
    if failover:
        av = Availability(client.ping, mode=getattr(cfg, "on_unavailable", "fail_closed"),
                          instances=getattr(cfg, "instances_expected", 1),
                          probe_interval_s=getattr(cfg, "probe_interval_s", 1.0), on_change=on_change)
        limiter, ledger = FailoverLimiter(limiter, av), FailoverLedger(ledger, av)
    return SharedLimits("redis", limiter, ledger, store, owns, av)
