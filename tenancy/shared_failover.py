"""What admission does while Redis does not answer (issue 16, ``state.on_unavailable``).

:class:`Availability` remembers whether the shared store answers. The first
failed admission marks it unavailable (an error log line, the ``on_change``
callback: the gateway's ``prefixgate_state_available`` gauge) and starts a
probe (``PING`` every ``probe_interval_s``); while unavailable, admission
does not wait for Redis at all, and the first answered probe makes it use
Redis again, without a restart.

Meanwhile, by ``mode``:

- ``fail_closed``: :class:`StateUnavailable` (the gateway answers 503
  ``state_unavailable`` with ``Retry-After``).
- ``local``: an in-process :class:`tenancy.limits.TenantLimiter` and
  :class:`tenancy.ledger.InProcessLedger` enforce every tenant's limits
  divided by ``instances`` (:func:`scaled_tenant`), so N processes together
  admit about what one shared bucket would.

A request admitted through Redis whose batch sequences cannot be charged
because Redis went away in between is refused with :class:`StateUnavailable`
in both modes (its slot is in Redis; a local charge would not cover it).
Releases and settlements of Redis-admitted requests stay queued on the
store's writer (:class:`tenancy.shared_store.Writer`) and are applied when
Redis answers again.
"""

from __future__ import annotations

import asyncio
import functools
import dataclasses
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from tenancy.ledger import InProcessLedger, LedgerTotals, Reservation
from tenancy.limits import Lease, LimitExceeded, TenantLimiter
from tenancy.prompt_room import PromptRoom
from tenancy.registry import Tenant
from tenancy.shared_ledger import RedisLedger
from tenancy.shared_limiter import RedisTenantLimiter, SharedLease
from tenancy.shared_store import cancel_task

__all__ = ["unavailable_errors", "Availability", "FailoverLedger", "FailoverLimiter", "StateUnavailable", "scaled_tenant"]

log = logging.getLogger("prefixgate.state")

@functools.cache
def unavailable_errors() -> tuple[type[BaseException], ...]:
    """What counts as "Redis does not answer": redis-py's ``RedisError``
    (connection refused or reset, timeout, protocol error), ``OSError`` and
    ``asyncio.TimeoutError``. A function, so that the memory backend never
    imports redis (an ``except`` clause evaluates it only when an exception
    reaches it)."""
    from redis.exceptions import RedisError

    return (RedisError, OSError, asyncio.TimeoutError)


class StateUnavailable(LimitExceeded):
    """The shared state does not answer and ``state.on_unavailable`` is ``fail_closed``
    (or a Redis-admitted batch could not be charged): HTTP 503 with ``Retry-After``."""


def scaled_tenant(tenant: Tenant, instances: int) -> Tenant:
    """``tenant`` with every rate, burst and concurrency limit divided by ``instances``.

    Rates and token bursts are divided exactly; the request burst is at
    least 1 and the concurrency at least 1 (rounded up), so a tenant can
    still make one request per process. ``instances`` >= 1.
    """
    if instances <= 1:
        return tenant

    def div(x: float | None, floor: float = 0.0) -> float | None:
        return None if x is None else max(floor, x / instances)

    def burst(rate: float | None, b: float | None) -> float | None:  # the effective burst (limits.py default)
        return None if rate is None else (b if b is not None else max(1.0, rate))

    conc = tenant.max_concurrency
    return dataclasses.replace(
        tenant,
        rate_rps=div(tenant.rate_rps),
        rate_burst=div(burst(tenant.rate_rps, tenant.rate_burst), 1.0),
        max_concurrency=None if conc is None else max(1, math.ceil(conc / instances)),
        prompt_tokens_per_s=div(tenant.prompt_tokens_per_s),
        prompt_tokens_burst=div(burst(tenant.prompt_tokens_per_s, tenant.prompt_tokens_burst)),
        output_tokens_per_s=div(tenant.output_tokens_per_s),
        output_tokens_burst=div(burst(tenant.output_tokens_per_s, tenant.output_tokens_burst)),
    )


class Availability:
    """Whether the shared store answers, with a background probe while it does not.

    ``ping``: a coroutine function that raises when Redis does not answer;
    ``mode``: ``fail_closed`` | ``local``; ``instances``: the divisor of
    local limits; ``probe_interval_s``: seconds between probes;
    ``on_change(available)``: called on every change (metrics). Counters:
    ``outages`` (changes to unavailable), ``local_decisions`` (admissions
    decided locally), ``refused`` (fail-closed refusals).
    """

    def __init__(self, ping: Callable[[], Any], *, mode: str, instances: int, probe_interval_s: float,
                 on_change: Callable[[bool], None] | None = None) -> None:
        if mode not in ("fail_closed", "local"):
            raise ValueError("mode must be fail_closed or local")
        self._ping = ping
        self.mode = mode
        self.instances = max(1, int(instances))
        self.probe_interval_s = probe_interval_s
        self.on_change = on_change
        self.available = True
        self.outages = 0
        self.local_decisions = 0
        self.refused = 0
        #: called with no argument on every local decision (metrics)
        self.on_local_decision: Callable[[], Any] | None = None
        self._probe: asyncio.Task[None] | None = None
        self._scaled: dict[int, tuple[Tenant, Tenant]] = {}

    def failed(self, exc: BaseException) -> None:
        """Redis did not answer (``exc``): switch to the ``mode`` behaviour and start probing."""
        if self.available:
            self.available = False
            self.outages += 1
            what = ("refusing admissions (503)" if self.mode == "fail_closed"
                    else f"enforcing limits / {self.instances} in this process")
            log.error("ALERT shared state unavailable (%s): %s until Redis answers again",
                      exc.__class__.__name__, what)
            if self.on_change is not None:
                self.on_change(False)
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_loop(), name="prefixgate-state-probe")

    def refuse(self) -> StateUnavailable:
        """The fail-closed refusal (counted)."""
        self.refused += 1
        return StateUnavailable(max(1.0, self.probe_interval_s), "state_unavailable")

    def local(self, tenant: Tenant) -> Tenant:
        """Count one local decision and return the scaled ``tenant`` it is taken against."""
        self.local_decisions += 1
        if self.on_local_decision is not None:
            self.on_local_decision()
        return self.scaled(tenant)

    def scaled(self, tenant: Tenant) -> Tenant:
        """:func:`scaled_tenant` of ``tenant``, cached per tenant object (a reload makes new ones)."""
        hit = self._scaled.get(id(tenant))
        if hit is not None and hit[0] is tenant:
            return hit[1]
        if len(self._scaled) > 4096:
            self._scaled.clear()
        out = scaled_tenant(tenant, self.instances)
        self._scaled[id(tenant)] = (tenant, out)
        return out

    async def _probe_loop(self) -> None:
        while not self.available:
            await asyncio.sleep(self.probe_interval_s)
            try:
                await self._ping()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - still down: probe again
                continue
            self.available = True
            log.warning("shared state available again: admission uses Redis (%d decided locally, %d refused "
                        "so far)", self.local_decisions, self.refused)
            if self.on_change is not None:
                self.on_change(True)

    async def aclose(self) -> None:
        """Stop the probe."""
        if self._probe is not None:
            await cancel_task(self._probe)
            self._probe = None


class FailoverLimiter:
    """:class:`RedisTenantLimiter` while Redis answers, else the ``mode`` behaviour (module doc).

    Same async methods as the Redis limiter; ``local`` is the in-process
    limiter used while unavailable (``in_flight`` counts both).
    """

    def __init__(self, shared: RedisTenantLimiter, availability: Availability) -> None:
        self.shared = shared
        self.local = TenantLimiter()
        self.av = availability

    async def admit(self, tenant: Tenant, now: float | None = None, *, slot: bool = True) -> SharedLease | Lease:
        """Admit one request (raises RateLimited, ConcurrencyLimited, StateUnavailable);
        ``slot=False``: no concurrency slot yet (:meth:`take_slots`)."""
        if self.av.available:
            try:
                return await self.shared.admit(tenant, now, slot=slot)
            except unavailable_errors() as exc:
                self.av.failed(exc)
        if self.av.mode == "fail_closed":
            raise self.av.refuse()
        return self.local.admit(self.av.local(tenant), slot=slot)

    async def add_sequences(self, tenant: Tenant, lease: SharedLease | Lease, extra: int,
                            now: float | None = None, *, slots: bool = True) -> None:
        """Charge a batch's extra sequences where its lease was taken."""
        if isinstance(lease, Lease):
            self.local.add_sequences(self.av.scaled(tenant), lease, extra, slots=slots)
            return
        try:
            await self.shared.add_sequences(tenant, lease, extra, now, slots=slots)
        except unavailable_errors() as exc:
            self.av.failed(exc)
            raise self.av.refuse() from None

    def take_slots_now(self, tenant: Tenant, lease: SharedLease | Lease, n: int) -> bool | None:
        """Take ``n`` slots at once where that needs no Redis answer (a lease admitted locally
        during an outage): True taken, False refused (at concurrency); None: use :meth:`take_slots`."""
        if not isinstance(lease, Lease):
            return None
        try:
            self.local.take_slots(self.av.scaled(tenant), lease, n)
        except LimitExceeded:
            return False
        return True

    async def take_slots(self, tenant: Tenant, lease: SharedLease | Lease, n: int) -> None:
        """Take ``n`` slots where the lease was taken (raises ConcurrencyLimited; StateUnavailable
        when Redis does not answer for a Redis lease, in both modes, as :meth:`add_sequences`)."""
        if isinstance(lease, Lease):
            self.local.take_slots(self.av.scaled(tenant), lease, n)
            return
        try:
            await self.shared.take_slots(tenant, lease, n)
        except unavailable_errors() as exc:
            self.av.failed(exc)
            raise self.av.refuse() from None

    async def charge_prompt_tokens(self, tenant: Tenant, n: int, now: float | None = None) -> None:
        """Charge prompt tokens to the shared bucket (the local one while unavailable, ``local`` mode)."""
        if self.av.available:
            try:
                await self.shared.charge_prompt_tokens(tenant, n, now)
                return
            except unavailable_errors() as exc:
                self.av.failed(exc)
        if self.av.mode == "fail_closed":
            raise self.av.refuse()
        self.local.charge_prompt_tokens(self.av.scaled(tenant), n)

    async def in_flight(self, tenant_id: str) -> int:
        """Slots in Redis (all instances) plus this process's local leases."""
        shared = await self.shared.in_flight(tenant_id) if self.av.available else 0
        return shared + self.local.in_flight(tenant_id)

    def forget(self, keep: set[str]) -> None:
        """Drop local state of removed tenants (Redis keys expire on their own)."""
        self.local.forget(keep)


class FailoverLedger:
    """:class:`RedisLedger` while Redis answers, else the ``mode`` behaviour (module doc)."""

    def __init__(self, shared: RedisLedger, availability: Availability) -> None:
        self.shared = shared
        self.local = InProcessLedger()
        self.av = availability

    async def reserve(self, tenant: Tenant, prompt_tokens: int, output_tokens: int,
                      now: float | None = None) -> Reservation:
        """Reserve tokens (raises RateLimited, StateUnavailable)."""
        if self.av.available:
            try:
                return await self.shared.reserve(tenant, prompt_tokens, output_tokens, now)
            except unavailable_errors() as exc:
                self.av.failed(exc)
        if self.av.mode == "fail_closed":
            raise self.av.refuse()
        return self.local.reserve(self.av.local(tenant), prompt_tokens, output_tokens)

    def prompt_room(self, tenant: Tenant, lease: SharedLease | Lease | None = None) -> PromptRoom | None:
        """The prompt bucket's room before tokenizing (review R3-2). ``lease``: the request's, from
        :meth:`FailoverLimiter.admit`. Admitted through Redis: the shared bucket's level, read by the
        admit script in the same round trip (:meth:`SharedLease.prompt_room`; so a tenant in debt
        through any instance is refused untokenized on every one). Admitted locally during an outage
        (``local`` mode): the local bucket's. Otherwise ``None`` (the reservation decides)."""
        if isinstance(lease, SharedLease):
            return lease.prompt_room(tenant)
        if self.av.available or self.av.mode != "local":
            return None
        return self.local.prompt_room(self.av.scaled(tenant))

    async def totals(self) -> Mapping[str, LedgerTotals]:
        """The shared totals (what was reserved locally during an outage is not in them)."""
        return await self.shared.totals()

    async def level(self, tenant_id: str, kind: str, now: float | None = None) -> float | None:
        """The shared bucket's level (see :meth:`RedisLedger.level`)."""
        return await self.shared.level(tenant_id, kind, now)

    def forget(self, keep: set[str]) -> None:
        """Drop local state of removed tenants."""
        self.local.forget(keep)
