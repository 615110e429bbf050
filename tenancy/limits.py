"""Per-tenant and per-source admission limits: token buckets and concurrency.

Order in the gateway (cheapest rejection first)::

    token needs a signature ─► SourceLimiter.check (only before a signature check; cheap refusals and cached tokens never)
    tenant resolved ─► TenantLimiter.admit      (requests/s + concurrency; before tokenizing)
    prompt tokenized ─► TenantLimiter.charge_prompt_tokens (prompt tokens/s, max_prompt_tokens)

Bucket semantics (classic token bucket): a bucket of capacity ``burst`` refills
at ``rate`` per second. A request bucket takes 1 per request. A prompt-token
bucket takes ``n`` tokens but, because ``n`` is only known after
tokenizing, it admits a prompt when the bucket holds ``min(n, burst)`` and may
go into debt (negative level) for the rest: a prompt larger than the burst is
still served when the bucket is full, and the debt delays later requests. A
rejected request takes nothing. ``Retry-After`` is the time until the bucket
holds enough again, in seconds.

No maintained library fits: ``limits`` offers window counters with integer
quotas on wall-clock storage (no token bucket, no injectable clock, no
debt), ``aiolimiter`` waits instead of rejecting and reads the loop clock;
so the bucket here is a few lines of arithmetic on an injected ``now``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

from tenancy.registry import Tenant

__all__ = [
    "LimitExceeded",
    "RateLimited",
    "ConcurrencyLimited",
    "TokenBucket",
    "Lease",
    "ReleasedOnExit",
    "TenantLimiter",
    "clamp_max_tokens",
]


class LimitExceeded(Exception):
    """Base of admission refusals. ``retry_after_s`` (seconds, for a 429
    ``Retry-After`` header, round up) and a short machine ``reason``."""

    def __init__(self, retry_after_s: float, reason: str) -> None:
        super().__init__(f"{reason} (retry after {retry_after_s:.3f}s)")
        self.retry_after_s = retry_after_s
        self.reason = reason

    @property
    def retry_after_header(self) -> str:
        """``Retry-After`` value: whole seconds, rounded up, at least 1 (RFC 9110 §10.2.3)."""
        return str(max(1, math.ceil(self.retry_after_s)))


class RateLimited(LimitExceeded):
    """A token bucket is empty: HTTP 429 with ``Retry-After``."""


class ConcurrencyLimited(LimitExceeded):
    """The tenant already has ``max_concurrency`` requests in flight: HTTP 429."""


class TokenBucket:
    """Token bucket of ``burst`` capacity refilling at ``rate`` per second.

    Starts full at time ``now``. Pure arithmetic on caller-supplied ``now``
    (monotonic seconds); not thread-safe by itself.
    """

    __slots__ = ("rate", "burst", "level", "updated")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        if not (rate > 0 and burst > 0):
            raise ValueError("rate and burst must be positive")
        self.rate = float(rate)
        self.burst = float(burst)
        self.level = float(burst)
        self.updated = now

    def refill(self, now: float) -> float:
        """Add what accrued until ``now`` (capped at the burst); return the level."""
        if now > self.updated:  # = _refill(now), without its call (issue 14, session 18)
            self.level = min(self.burst, self.level + (now - self.updated) * self.rate)
            self.updated = now
        return self.level

    def _refill(self, now: float) -> None:
        if now > self.updated:
            self.level = min(self.burst, self.level + (now - self.updated) * self.rate)
            self.updated = now

    def wait_for(self, n: float, now: float) -> float:
        """Refill to ``now``; seconds until the level reaches ``min(n, burst)`` (0.0: now). Takes nothing
        (the token ledger checks both its buckets before taking from either: issue 14, session 18, one call
        per bucket where a refill and a separate check were two)."""
        if now > self.updated:
            self.level = min(self.burst, self.level + (now - self.updated) * self.rate)
            self.updated = now
        need = min(float(n), self.burst)
        return 0.0 if self.level >= need else (need - self.level) / self.rate

    def try_take(self, n: float, now: float, *, allow_debt: bool = False, need: float | None = None) -> float:
        """Take ``n`` units; return 0.0 on success, else seconds until it would succeed.

        Without ``allow_debt`` needs ``level >= n`` (``n > burst`` can never
        succeed: returns ``inf``). With ``allow_debt`` needs ``level >= min(n, burst)``
        (or ``need`` when given, at most the burst) and the level may go negative.
        """
        if now > self.updated:  # = _refill(now), without its call (issue 14, session 18: two buckets per request)
            self.level = min(self.burst, self.level + (now - self.updated) * self.rate)
            self.updated = now
        if allow_debt:
            need = min(n, self.burst) if need is None else min(need, self.burst)
        else:
            need = n
        if need > self.burst:
            return math.inf
        if self.level >= need:
            self.level -= n
            return 0.0
        return (need - self.level) / self.rate

    def reconfigure(self, rate: float, burst: float, now: float) -> None:
        """Change rate/burst keeping the current level (clamped to the new burst)."""
        self._refill(now)
        self.rate = float(rate)
        self.burst = float(burst)
        self.level = min(self.level, self.burst)


class ReleasedOnExit:
    """A lease released once: :meth:`release` frees what it holds the first time (``_free``,
    defined by the subclass), later calls do nothing; usable as ``with`` or ``async with``
    (leaving the block releases it). :class:`Lease`, :class:`tenancy.shared_limiter.SharedLease`."""

    __slots__ = ("_done",)

    def __init__(self) -> None:
        self._done = False

    def _free(self) -> None:
        raise NotImplementedError

    @property
    def released(self) -> bool:
        """True once :meth:`release` has run."""
        return self._done

    def release(self) -> None:
        """Free what the lease holds (second and later calls do nothing)."""
        if not self._done:
            self._done = True
            self._free()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()


class Lease(ReleasedOnExit):
    """One admitted in-flight request; :meth:`release` frees its concurrency slots.

    ``weight``: the slots it holds (1, or the number of sequences of a batch
    after :meth:`TenantLimiter.add_sequences`). Idempotent; usable as
    ``with`` or ``async with``.
    """

    __slots__ = ("_release", "tenant_id", "weight")

    def __init__(self, tenant_id: str, release: Callable[[], None]) -> None:
        self._done = False  # = ReleasedOnExit.__init__, without its call (one lease per request; session 16)
        self.tenant_id = tenant_id
        self._release = release
        self.weight = 1

    def _free(self) -> None:
        self._release()


@dataclass
class _TenantState:
    requests: TokenBucket | None = None
    prompt_tokens: TokenBucket | None = None
    in_flight: int = 0


class TenantLimiter:
    """Per-tenant requests/s bucket, prompt-tokens/s bucket and concurrency limit.

    Limits are read from each :class:`~tenancy.registry.Tenant` at every call,
    so a registry reload takes effect at once (buckets keep their level).
    ``clock`` gives monotonic seconds when ``now`` is omitted. Thread-safe.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._tenants: dict[str, _TenantState] = {}

    def __len__(self) -> int:
        """Number of tenants with limiter state (buckets or leases)."""
        return len(self._tenants)

    def in_flight(self, tenant_id: str) -> int:
        """Return the number of unreleased leases of ``tenant_id``."""
        st = self._tenants.get(tenant_id)
        return st.in_flight if st else 0

    def admit(self, tenant: Tenant, now: float | None = None, *, slot: bool = True) -> Lease:
        """Admit one request of ``tenant``; return its :class:`Lease`.

        Raises :class:`ConcurrencyLimited` (``max_concurrency`` in flight;
        retry_after 1 s) or :class:`RateLimited` (``rate_rps`` bucket empty).
        A refused request consumes nothing. ``slot=False``: take the request
        unit only; the lease holds no concurrency slot (``weight`` 0) until
        :meth:`take_slots` (flow control takes it when the request leaves
        its queue, docs/fairness.md).
        """
        now = self._clock() if now is None else now
        with self._lock:
            st = self._tenants.get(tenant.id) or self._tenants.setdefault(tenant.id, _TenantState())
            if slot and tenant.max_concurrency is not None and st.in_flight >= tenant.max_concurrency:
                raise ConcurrencyLimited(1.0, "tenant_concurrency")
            if tenant.rate_rps is not None:
                burst = tenant.rate_burst or max(1.0, tenant.rate_rps)
                st.requests = _bucket(st.requests, tenant.rate_rps, burst, now)
                wait = st.requests.try_take(1, now)
                if wait > 0:
                    raise RateLimited(wait, "tenant_request_rate")
            else:
                st.requests = None
            if slot:
                st.in_flight += 1
        lease = Lease(tenant.id, lambda: self._release(tenant.id, lease.weight))
        if not slot:
            lease.weight = 0
        return lease

    def take_slots(self, tenant: Tenant, lease: Lease, n: int) -> None:
        """Take ``n`` concurrency slots for ``lease`` (admitted with ``slot=False``); its
        ``weight`` grows by ``n`` and :meth:`Lease.release` frees them. Raises
        :class:`ConcurrencyLimited` when ``in_flight + n`` would exceed ``max_concurrency``
        (nothing taken). A released lease takes nothing."""
        if n <= 0:
            return
        with self._lock:
            if lease.released:
                return
            st = self._tenants.get(tenant.id) or self._tenants.setdefault(tenant.id, _TenantState())
            if tenant.max_concurrency is not None and st.in_flight + n > tenant.max_concurrency:
                raise ConcurrencyLimited(1.0, "tenant_concurrency")
            st.in_flight += n
            lease.weight += n

    def add_sequences(self, tenant: Tenant, lease: Lease, extra: int, now: float | None = None, *,
                      slots: bool = True) -> None:
        """Charge ``extra`` more sequences of an admitted batch request to ``tenant``.

        Each extra sequence takes one concurrency slot (the lease's
        ``weight`` grows; :meth:`Lease.release` frees them all; not with
        ``slots=False``: :meth:`take_slots` takes them later) and one unit
        of the request bucket; a batch larger than the burst is served when
        the bucket is full and leaves it in debt, as the prompt-token bucket does. Raises
        :class:`ConcurrencyLimited` or :class:`RateLimited` (reason
        ``tenant_request_rate``); a refused charge takes nothing.
        """
        if extra <= 0:
            return
        now = self._clock() if now is None else now
        with self._lock:
            if lease.released:
                return
            st = self._tenants.get(tenant.id) or self._tenants.setdefault(tenant.id, _TenantState())
            if slots and tenant.max_concurrency is not None and st.in_flight + extra > tenant.max_concurrency:
                raise ConcurrencyLimited(1.0, "tenant_concurrency")
            if tenant.rate_rps is not None:
                burst = tenant.rate_burst or max(1.0, tenant.rate_rps)
                st.requests = _bucket(st.requests, tenant.rate_rps, burst, now)
                # the whole batch needs min(sequences, burst) units; admit() took the first
                wait = st.requests.try_take(extra, now, allow_debt=True,
                                            need=min(extra, max(0.0, st.requests.burst - 1)))
                if wait > 0:
                    raise RateLimited(wait, "tenant_request_rate")
            if slots:
                st.in_flight += extra
                lease.weight += extra

    def charge_prompt_tokens(self, tenant: Tenant, n: int, now: float | None = None) -> None:
        """Charge ``n`` prompt tokens (all sequences of a request) to ``tenant`` after tokenizing.

        The prompt's size limit (``max_prompt_tokens``, per sequence) is the
        caller's check, made before this charge. Raises :class:`RateLimited`
        (reason ``tenant_prompt_tokens``) if the prompt-token bucket cannot
        cover it (see module doc on debt).
        """
        if n < 0:
            raise ValueError("token count must be >= 0")
        if tenant.prompt_tokens_per_s is None:
            return
        now = self._clock() if now is None else now
        with self._lock:
            st = self._tenants.get(tenant.id) or self._tenants.setdefault(tenant.id, _TenantState())
            burst = tenant.prompt_tokens_burst or max(1.0, tenant.prompt_tokens_per_s)
            st.prompt_tokens = _bucket(st.prompt_tokens, tenant.prompt_tokens_per_s, burst, now)
            wait = st.prompt_tokens.try_take(n, now, allow_debt=True)
            if wait > 0:
                raise RateLimited(wait, "tenant_prompt_tokens")

    def forget(self, keep: set[str]) -> None:
        """Drop state of tenants not in ``keep`` that have nothing in flight.

        The gateway calls this after every registry reload with the ids of the
        tenants still configured, so a removed tenant's buckets are freed (one
        with requests still in flight is dropped at a later reload)."""
        with self._lock:
            for tid in [t for t, st in self._tenants.items() if t not in keep and st.in_flight == 0]:
                del self._tenants[tid]

    def _release(self, tenant_id: str, weight: int = 1) -> None:
        with self._lock:
            st = self._tenants.get(tenant_id)
            if st is not None and st.in_flight > 0:
                st.in_flight = max(0, st.in_flight - weight)


def _bucket(existing: TokenBucket | None, rate: float, burst: float, now: float) -> TokenBucket:
    if existing is None:
        return TokenBucket(rate, burst, now)
    if existing.rate != rate or existing.burst != burst:
        existing.reconfigure(rate, burst, now)
    return existing


def clamp_max_tokens(
    requested: int | None,
    tenant_cap: int | None,
    policy_cap: int | None,
    *,
    default: int,
) -> int:
    """Return the ``max_tokens`` (output tokens) to send upstream.

    The cap is the smallest of ``tenant_cap`` and ``policy_cap`` (those not
    None). A request without ``max_tokens`` gets the cap, or ``default``
    (the gateway's ``limits.max_output_tokens``) when no cap exists, so the
    output is always bounded; a request above the cap is clamped down to it
    (not refused: OpenAI semantics let the answer stop with
    ``finish_reason="length"``). Raises :class:`ValueError` for a
    non-positive request.
    """
    if requested is not None and (isinstance(requested, bool) or requested <= 0):
        raise ValueError("max_tokens must be a positive integer")
    caps = [c for c in (tenant_cap, policy_cap) if c is not None]
    cap = min(caps) if caps else None
    if requested is None:
        return default if cap is None else cap
    return requested if cap is None else min(requested, cap)

