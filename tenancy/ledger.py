"""Token ledger: per-tenant prompt- and output-token limits that reserve before dispatch.

Issue 12, finding 4 (public report: concurrent requests bypass a
tokens-per-minute limit because usage is counted after completion). A request
is admitted only when its tenant's token buckets can cover what it *may*
use, and is reconciled with what it *did* use when it ends::

    tokenized  ─► ledger.reserve(tenant, prompt, output) ─► Reservation
                  (prompt bucket: the prompt's tokens, all sequences;
                   output bucket: max_tokens x sequences)
    decided    ─► reservation.lower_output(n)   (the policy lowered max_tokens)
    ended      ─► reservation.settle(prompt, output, basis)
                  (refund what was reserved and not used; take what was used
                   beyond the reservation as debt)

Buckets follow :class:`tenancy.limits.TokenBucket` (capacity ``burst``,
refill ``rate`` per second, "debt" semantics): a reservation of ``n`` needs
``min(n, burst)`` in the bucket and takes ``n``, so one request larger than
the burst is still served from a full bucket and leaves it negative. Both
buckets are checked first and taken together: a refused reservation takes
nothing. A refund never lifts a bucket above its burst.

**Bound.** Over any interval of ``T`` seconds the tokens a tenant is charged
per bucket are at most ``burst + rate x T + max(0, n_max - burst)`` where
``n_max`` is the largest single reservation (the one request admitted from a
full bucket into debt), plus what replicas report beyond the reservation
(a replica tokenizer counting more prompt tokens than the gateway's). With
``n_max <= burst`` the overshoot term is 0.

**What is charged when a request ends** (:func:`charge_for`):

=================  =============================================  ==========
basis              when                                           charge
=================  =============================================  ==========
``usage``          the replica reported usage                     its prompt + completion tokens
``relayed``        no usage; a stream relayed some output          reserved prompt + output received (R8-3)
``refused``        no usage; the replica answered an error status  reserved prompt
``reservation``    no usage; progress unknown (timeout, cancelled  the whole reservation
                   while waiting, plain answer without usage)
``not_dispatched`` the request never reached a replica             0 (all refunded)
=================  =============================================  ==========

So a request that reached a replica is never charged 0. ``relayed`` output
is an estimate counted by the SSE scanner: one token per choice per content
delta event (each decode step of an OpenAI-compatible server sends at least
one token per event), a lower bound of what the replica generated.

The interface (:class:`TokenLedger`, :class:`Reservation`) is small on
purpose: the scale-out issue backs it with Redis. :class:`InProcessLedger`
is the single-instance implementation (thread-safe, injectable clock).
Methods never block; a shared-store implementation must queue settlements
rather than wait in :meth:`Reservation.settle`.
"""

from __future__ import annotations

import abc
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

from tenancy.charge import charge_for
from tenancy.limits import RateLimited, TokenBucket
from tenancy.prompt_room import PromptRoom
from tenancy.registry import Tenant

__all__ = ["BASES", "InProcessLedger", "LedgerTotals", "Reservation", "Settlement", "TokenLedger", "charge_for"]

#: Every charge basis, in the order of the table above.
BASES = ("usage", "relayed", "refused", "reservation", "not_dispatched")


@dataclass(frozen=True, slots=True)
class Settlement:
    """The end of one reservation (all counts in tokens).

    ``reserved_*``: what the reservation held when settled; ``charged_*``:
    what the tenant pays; ``refunded_*``: ``max(0, reserved - charged)``;
    ``basis``: one of :data:`BASES`.
    """

    reserved_prompt: int
    reserved_output: int
    charged_prompt: int
    charged_output: int
    basis: str

    @property
    def reserved(self) -> int:
        """Prompt plus output tokens reserved."""
        return self.reserved_prompt + self.reserved_output

    @property
    def charged(self) -> int:
        """Prompt plus output tokens charged."""
        return self.charged_prompt + self.charged_output

    @property
    def refunded_prompt(self) -> int:
        """Prompt tokens given back to the bucket."""
        return max(0, self.reserved_prompt - self.charged_prompt)

    @property
    def refunded_output(self) -> int:
        """Output tokens given back to the bucket."""
        return max(0, self.reserved_output - self.charged_output)


@dataclass(slots=True)
class LedgerTotals:
    """Running per-tenant totals (tokens) since the ledger started, by ``prompt``/``output``.

    ``reserved`` = ``charged`` + ``refunded`` + what open reservations hold
    - what was charged beyond reservations; a reservation lowered before
    dispatch (:meth:`Reservation.lower_output`) counts the difference as refunded.
    """

    reserved: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "output": 0})
    charged: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "output": 0})
    refunded: dict[str, int] = field(default_factory=lambda: {"prompt": 0, "output": 0})
    open_reservations: int = 0


class Reservation(abc.ABC):
    """Tokens held for one admitted request until it ends.

    ``tenant_id``; ``prompt_tokens`` and ``output_tokens``: what is held now.
    :meth:`settle` ends it (idempotent: the first call wins and later calls
    return the same :class:`Settlement`).
    """

    tenant_id: str
    prompt_tokens: int
    output_tokens: int

    @property
    @abc.abstractmethod
    def settlement(self) -> Settlement | None:
        """The settlement once settled, else None."""

    @abc.abstractmethod
    def lower_output(self, output_tokens: int) -> None:
        """Hold only ``output_tokens`` output tokens (never more than held now);
        the difference is refunded at once. No-op once settled."""

    @abc.abstractmethod
    def settle(self, prompt_tokens: int, output_tokens: int, basis: str) -> Settlement:
        """Charge ``prompt_tokens`` + ``output_tokens`` (>= 0) and end the reservation.

        Less than reserved: the rest is refunded; more: the excess is taken
        as debt (the buckets may go negative). Raises :class:`ValueError`
        for a negative count or an unknown ``basis``.
        """

    def settle_later(self, prompt_tokens: int, output_tokens: int, basis: str) -> tuple[Settlement, Callable[[], None] | None]:
        """:meth:`settle` in two steps (issue 14, session 11): the :class:`Settlement` is fixed now
        (later :meth:`settle` calls return it; :meth:`lower_output` is a no-op) and what gives tokens
        back to the buckets is returned, to be called once, later (after the answer's last byte):
        until then the buckets still hold the reservation, the safe side. A charge beyond the
        reservation in either bucket (debt) is applied now, as :meth:`settle` applies it; then, or when
        already settled, the second item is None. Raises as :meth:`settle`. Default: :meth:`settle`."""
        return self.settle(prompt_tokens, output_tokens, basis), None


class TokenLedger(abc.ABC):
    """Reserves and reconciles a tenant's prompt and output tokens (see module doc)."""

    @abc.abstractmethod
    def reserve(self, tenant: Tenant, prompt_tokens: int, output_tokens: int,
                now: float | None = None) -> Reservation:
        """Reserve ``prompt_tokens`` in the tenant's prompt-token bucket and
        ``output_tokens`` (``max_tokens`` x sequences) in its output-token bucket.

        Buckets the tenant has no limit for are not checked (the reservation
        is still recorded, for accounting). Raises
        :class:`~tenancy.limits.RateLimited` with reason
        ``tenant_prompt_tokens`` or ``tenant_output_tokens`` (``retry_after_s``:
        seconds until both would succeed) and takes nothing then.
        """

    @abc.abstractmethod
    def totals(self) -> Mapping[str, LedgerTotals]:
        """A snapshot of the per-tenant totals, by tenant id."""


class _Buckets:
    __slots__ = ("output", "prompt", "totals")

    def __init__(self) -> None:
        self.prompt: TokenBucket | None = None
        self.output: TokenBucket | None = None
        self.totals = LedgerTotals()


def _sync_bucket(existing: TokenBucket | None, rate: float | None, burst: float | None,
                 now: float) -> TokenBucket | None:
    if rate is None:
        return None
    burst = burst if burst is not None else max(1.0, rate)
    if existing is None:
        return TokenBucket(rate, burst, now)
    if existing.rate != rate or existing.burst != burst:
        existing.reconfigure(rate, burst, now)
    return existing


_NO_LOCK = contextlib.nullcontext()  # stateless and reusable: the lock of a ledger that needs none


class LedgerReservation(Reservation):
    """The bookkeeping every ledger's reservation shares: argument checks, the
    lower-only ``lower_output``, the first-call-wins ``settle``. A ledger
    implements :meth:`_apply` (move the difference into its buckets) and may
    give ``lock`` (a lock around check-and-apply; default: none). Session 14: the lock is an
    attribute, not a method call per use (issue 14)."""

    def __init__(self, tenant_id: str, prompt: int, output: int,
                 lock: contextlib.AbstractContextManager[object] = _NO_LOCK) -> None:
        self.tenant_id = tenant_id
        self.prompt_tokens = prompt
        self.output_tokens = output
        self._settlement: Settlement | None = None
        self._lock = lock

    @property
    def settlement(self) -> Settlement | None:
        return self._settlement

    @abc.abstractmethod
    def _apply(self, d_prompt: int, d_output: int, settled: Settlement | None) -> None:
        """Apply a change of ``d_prompt``/``d_output`` tokens to the buckets: a refund when
        negative, debt when positive. ``settled`` is the settlement, or None for a
        :meth:`lower_output` before dispatch."""

    def lower_output(self, output_tokens: int) -> None:
        if output_tokens < 0:
            raise ValueError("token count must be >= 0")
        with self._lock:
            if self._settlement is not None or output_tokens >= self.output_tokens:
                return
            refund = self.output_tokens - output_tokens
            self.output_tokens = output_tokens
            self._apply(0, -refund, None)

    def settle(self, prompt_tokens: int, output_tokens: int, basis: str) -> Settlement:
        return self.settle_later(prompt_tokens, output_tokens, basis, defer=False)[0]

    def settle_later(self, prompt_tokens: int, output_tokens: int, basis: str,
                     defer: bool = True) -> tuple[Settlement, Callable[[], None] | None]:
        if prompt_tokens < 0 or output_tokens < 0:
            raise ValueError("token count must be >= 0")
        if basis not in BASES:
            raise ValueError(f"unknown charge basis {basis!r}")
        with self._lock:
            if self._settlement is not None:
                return self._settlement, None
            s = Settlement(self.prompt_tokens, self.output_tokens, prompt_tokens, output_tokens, basis)
            self._settlement = s
            d_prompt, d_output = prompt_tokens - self.prompt_tokens, output_tokens - self.output_tokens
            if not defer or d_prompt > 0 or d_output > 0:  # debt: at once
                self._apply(d_prompt, d_output, s)
                return s, None
        return s, partial(self._apply_locked, d_prompt, d_output, s)

    def _apply_locked(self, d_prompt: int, d_output: int, settled: Settlement) -> None:
        with self._lock:
            self._apply(d_prompt, d_output, settled)


class _InProcessReservation(LedgerReservation):
    def __init__(self, ledger: InProcessLedger, tenant_id: str, prompt: int, output: int) -> None:
        # = LedgerReservation.__init__(tenant_id, prompt, output, ledger._lock), without its call (session 16)
        self.tenant_id, self.prompt_tokens, self.output_tokens = tenant_id, prompt, output
        self._settlement: Settlement | None = None
        self._lock = ledger._lock
        self._ledger = ledger

    def _apply(self, d_prompt: int, d_output: int, settled: Settlement | None) -> None:
        if settled is None:
            self._ledger._adjust(self.tenant_id, d_prompt, d_output, lowered=True)
        else:
            self._ledger._adjust(self.tenant_id, d_prompt, d_output, settled=settled)


class InProcessLedger(TokenLedger):
    """The ledger of one gateway instance: per-tenant buckets in memory.

    Limits are read from the :class:`~tenancy.registry.Tenant` at every
    :meth:`reserve` (``prompt_tokens_per_s``/``prompt_tokens_burst``,
    ``output_tokens_per_s``/``output_tokens_burst``), so a registry reload
    takes effect at once and buckets keep their level. ``clock``: monotonic
    seconds. Thread-safe.
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._tenants: dict[str, _Buckets] = {}

    def reserve(self, tenant: Tenant, prompt_tokens: int, output_tokens: int,
                now: float | None = None) -> Reservation:
        if prompt_tokens < 0 or output_tokens < 0:
            raise ValueError("token count must be >= 0")
        now = self._clock() if now is None else now
        with self._lock:
            # a _Buckets (three dicts) only when missing, not a throwaway per call (issue 14)
            st = self._tenants.get(tenant.id) or self._tenants.setdefault(tenant.id, _Buckets())
            # a tenant without a limit has no bucket (= _sync_bucket's answer, without its call: session 15)
            st.prompt = pb = None if tenant.prompt_tokens_per_s is None else _sync_bucket(
                st.prompt, tenant.prompt_tokens_per_s, tenant.prompt_tokens_burst, now)
            st.output = ob = None if tenant.output_tokens_per_s is None else _sync_bucket(
                st.output, tenant.output_tokens_per_s, tenant.output_tokens_burst, now)
            # each bucket refilled and checked in one call (TokenBucket.wait_for: session 18)
            wp = 0.0 if pb is None else pb.wait_for(prompt_tokens, now)
            wo = 0.0 if ob is None else ob.wait_for(output_tokens, now)
            if wp > 0 or wo > 0:  # the longer wait; the reason of the first bucket short (prompt, then output)
                raise RateLimited(max(wp, wo), "tenant_prompt_tokens" if wp > 0 else "tenant_output_tokens")
            if pb is not None:
                pb.level -= prompt_tokens
            if ob is not None:
                ob.level -= output_tokens
            st.totals.reserved["prompt"] += prompt_tokens
            st.totals.reserved["output"] += output_tokens
            st.totals.open_reservations += 1
        return _InProcessReservation(self, tenant.id, prompt_tokens, output_tokens)

    def prompt_room(self, tenant: Tenant, now: float | None = None) -> PromptRoom | None:
        """The prompt bucket's :class:`~tenancy.prompt_room.PromptRoom` (review R3-2); ``None``: any prompt fits."""
        if tenant.prompt_tokens_per_s is None:  # no prompt-token limit: what the bucket sync below answers (session 15)
            return None
        now = self._clock() if now is None else now
        with self._lock:
            st = self._tenants.get(tenant.id)  # None: never reserved, a full bucket
            if st is None or (b := _sync_bucket(st.prompt, tenant.prompt_tokens_per_s, tenant.prompt_tokens_burst,
                                                now)) is None or b.refill(now) >= b.burst:
                return None
            st.prompt = b
            return PromptRoom(max(0, int(b.level)), b.level, b.burst, b.rate)

    def totals(self) -> Mapping[str, LedgerTotals]:
        with self._lock:
            return {tid: LedgerTotals(dict(b.totals.reserved), dict(b.totals.charged), dict(b.totals.refunded),
                                      b.totals.open_reservations)
                    for tid, b in self._tenants.items()}

    def level(self, tenant_id: str, kind: str, now: float | None = None) -> float | None:
        """Current level of a tenant's ``prompt`` or ``output`` bucket (None: no limit). For tests/ops."""
        now = self._clock() if now is None else now
        with self._lock:
            st = self._tenants.get(tenant_id)
            bucket = None if st is None else (st.prompt if kind == "prompt" else st.output)
            return None if bucket is None else bucket.refill(now)

    def forget(self, keep: set[str]) -> None:
        """Drop state of tenants not in ``keep`` with no open reservation (after a reload)."""
        with self._lock:
            for tid in [t for t, b in self._tenants.items() if t not in keep and b.totals.open_reservations == 0]:
                del self._tenants[tid]

    # -- called with self._lock held by reservations
    def _adjust(self, tenant_id: str, d_prompt: int, d_output: int, *, lowered: bool = False,
                settled: Settlement | None = None) -> None:
        st = self._tenants.get(tenant_id) or self._tenants.setdefault(tenant_id, _Buckets())
        now = self._clock()
        for bucket, delta in ((st.prompt, d_prompt), (st.output, d_output)):
            if bucket is None or delta == 0:
                continue
            # refill to now first: what accrued since the last take must not absorb the overshoot
            # (otherwise whether an overshoot is charged depends on whether anything read the bucket)
            bucket.refill(now)
            if delta > 0:
                bucket.level -= delta  # used beyond the reservation: debt
            else:
                bucket.level = min(bucket.burst, bucket.level - delta)  # refund, never above the burst
        t = st.totals
        if lowered:
            t.refunded["output"] -= d_output  # the reservation shrank before dispatch: a refund
            return
        if settled is not None:
            t.open_reservations = max(0, t.open_reservations - 1)
            t.charged["prompt"] += settled.charged_prompt
            t.charged["output"] += settled.charged_output
            t.refunded["prompt"] += settled.refunded_prompt
            t.refunded["output"] += settled.refunded_output
