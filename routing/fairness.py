"""Fair order of queued requests across tenants: the Virtual Token Counter (pure, no I/O).

Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024),
Algorithm 2 (VTC), weighted variant: every tenant ``t`` has a virtual
counter ``c_t`` in weighted tokens. Serving a tenant adds
``tokens / weight_t`` to its counter — uncached prompt tokens when a request
is released to a replica, output tokens when it ends (the paper adds output
tokens as they are decoded; the gateway learns them at the end). The next
request released is the oldest queued request of the backlogged tenant with
the lowest counter, so over any interval in which two tenants are both
backlogged their weighted service differs by a bounded amount; with weights
2:1 they get tokens 2:1.

* **No banked credit**: a tenant that becomes backlogged (its queue was
  empty) is lifted to ``max(c_t, min c over the backlogged tenants)``, or to
  the counter of the tenant that last emptied its queue when none is
  backlogged (the paper's lift), so idling does not earn a burst later.
* **Work-conserving**: a request that cannot be placed now (no replica with
  room among its candidates) is skipped, not waited for: the next tenant in
  counter order is tried (up to ``scan_depth`` requests per tenant, oldest
  first), so an idle system gives one tenant everything.
* **Locality-aware** (Cao et al., DLPM's bounded deviation): when the
  fairest placeable request would go *cold* (its prefix replica has no room,
  another does), a request of a tenant whose counter is within
  ``locality_slack_tokens`` of it and that goes *warm* is released first;
  the fair one is released cold only when no such request exists. The
  unfairness this buys is bounded by the slack.

:class:`FairQueue` holds the queues and counters; the caller (the gateway's
dispatcher) says where each request could go now through a ``place``
function and charges the tokens it served.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

__all__ = ["FairQueue", "Placement", "Selection"]

T = TypeVar("T")

#: where a request could go now: ``warm`` (a replica holding its prefix, or it has no prefix to
#: lose), ``cold`` (only a replica without its prefix has room), ``None`` (no replica has room)
Placement = Literal["warm", "cold"] | None


@dataclass(slots=True)
class _Entry(Generic[T]):
    item: T
    seq: int


@dataclass(frozen=True, slots=True)
class Selection(Generic[T]):
    """The request to release: its ``tenant_id``, the ``item`` and its ``placement``."""

    tenant_id: str
    item: T
    placement: Literal["warm", "cold"]


@dataclass(slots=True)
class _Tenant(Generic[T]):
    counter: float = 0.0
    weight: float = 1.0
    queue: deque[_Entry[T]] = field(default_factory=deque)


class FairQueue(Generic[T]):
    """Per-tenant FIFO queues released in weighted Virtual Token Counter order (module doc).

    ``locality_slack_tokens`` (>= 0, weighted tokens): how far behind in
    fairness a warm request may jump a cold one; ``scan_depth`` (>= 1):
    queued requests looked at per tenant for one that can be placed.
    Raises :class:`ValueError` on a negative slack, a depth below 1, or a
    non-positive weight. Not thread-safe: use it from one event loop.
    """

    def __init__(self, *, locality_slack_tokens: float = 0.0, scan_depth: int = 8) -> None:
        if locality_slack_tokens < 0:
            raise ValueError("locality_slack_tokens must be >= 0")
        if scan_depth < 1:
            raise ValueError("scan_depth must be >= 1")
        self.locality_slack_tokens = float(locality_slack_tokens)
        self.scan_depth = scan_depth
        self._t: dict[str, _Tenant[T]] = {}
        self._seq = itertools.count()
        self._floor = 0.0  # counter of the tenant that last emptied its queue
        #: requests queued now (as ``len()``; an attribute: no call on the request path, issue 14); read only
        self.size = 0

    # -- state ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.size

    def queued(self, tenant_id: str) -> int:
        """Requests of ``tenant_id`` waiting now."""
        t = self._t.get(tenant_id)
        return len(t.queue) if t is not None else 0

    def counter(self, tenant_id: str) -> float:
        """The tenant's virtual counter in weighted tokens (0.0 for an unknown tenant)."""
        t = self._t.get(tenant_id)
        return t.counter if t is not None else 0.0

    def counters(self) -> dict[str, float]:
        """Every known tenant's virtual counter (weighted tokens)."""
        return {tid: t.counter for tid, t in self._t.items()}

    def backlogged(self) -> list[str]:
        """Tenants with at least one queued request."""
        return [tid for tid, t in self._t.items() if t.queue]

    # -- queueing ------------------------------------------------------------------------------
    def push(self, tenant_id: str, item: T, weight: float = 1.0) -> None:
        """Queue ``item`` behind ``tenant_id``'s earlier requests (``weight`` > 0: its tier's weight).

        A tenant that was not backlogged is lifted first (module doc: no banked credit).
        """
        if not weight > 0:
            raise ValueError("weight must be > 0")
        t = self._t.get(tenant_id)
        if t is None:
            t = self._t[tenant_id] = _Tenant(counter=self._floor)
        t.weight = float(weight)
        if not t.queue:
            others = [o.counter for tid, o in self._t.items() if o.queue and tid != tenant_id]
            t.counter = max(t.counter, min(others) if others else self._floor)
        t.queue.append(_Entry(item, next(self._seq)))
        self.size += 1

    def pass_through(self, tenant_id: str, weight: float = 1.0) -> None:
        """A request of ``tenant_id`` released at once while nothing is queued: the counter
        changes of :meth:`push` then :meth:`remove` of it (the lift; the floor it leaves), without
        the queue. Raises :class:`ValueError` on a non-positive weight or when anything is queued."""
        if not weight > 0:
            raise ValueError("weight must be > 0")
        if self.size:
            raise ValueError("pass_through needs an empty queue")
        t = self._t.get(tenant_id)
        if t is None:
            t = self._t[tenant_id] = _Tenant(counter=self._floor)
        t.weight = float(weight)
        if t.counter < self._floor:
            t.counter = self._floor
        self._floor = t.counter

    def remove(self, tenant_id: str, item: T) -> bool:
        """Take ``item`` out of the queue (a client that left, a request past its wait);
        True when it was queued."""
        t = self._t.get(tenant_id)
        if t is None:
            return False
        for e in t.queue:
            if e.item is item:
                t.queue.remove(e)
                self.size -= 1
                if not t.queue:
                    self._floor = t.counter
                return True
        return False

    def position(self, tenant_id: str, item: T) -> int | None:
        """``item``'s arrival number (for :meth:`put_back`), None when it is not queued."""
        t = self._t.get(tenant_id)
        for e in t.queue if t is not None else ():
            if e.item is item:
                return e.seq
        return None

    def put_back(self, tenant_id: str, item: T, refund_tokens: float = 0.0, position: int | None = None) -> None:
        """Return a released ``item`` to its tenant's queue (its release was undone: the tenant
        had no concurrency slot) and take back the ``refund_tokens`` charged for it. ``position``
        (from :meth:`position` before it was removed): its place in arrival order; None: the head."""
        t = self._t.get(tenant_id)
        if t is None:
            t = self._t[tenant_id] = _Tenant(counter=self._floor)
        if refund_tokens > 0:
            t.counter -= refund_tokens / t.weight
        if position is None:
            position = t.queue[0].seq - 1 if t.queue else next(self._seq)
        at = next((i for i, e in enumerate(t.queue) if e.seq > position), len(t.queue))
        t.queue.insert(at, _Entry(item, position))
        self.size += 1

    def charge(self, tenant_id: str, tokens: float, weight: float | None = None) -> None:
        """Add ``tokens`` (>= 0; uncached prompt tokens at release, output tokens at the end)
        divided by the tenant's weight (``weight``, else the last one pushed) to its counter."""
        if tokens <= 0:
            return
        t = self._t.get(tenant_id)
        if t is None:
            t = self._t[tenant_id] = _Tenant(counter=self._floor)
        if weight is not None and weight > 0:
            t.weight = float(weight)
        t.counter += tokens / t.weight

    def forget(self, keep: Iterable[str]) -> None:
        """Drop the counters of tenants not in ``keep`` that have nothing queued (registry reload)."""
        keep = set(keep)
        for tid in [tid for tid, t in self._t.items() if tid not in keep and not t.queue]:
            del self._t[tid]

    # -- release -------------------------------------------------------------------------------
    def select(self, place: Callable[[T], Placement]) -> Selection[T] | None:
        """The next request to release, or None when no queued request can be placed now.

        ``place(item)`` says where ``item`` could go now (:data:`Placement`); it is called
        for requests in counter order (lowest first; ties: the tenant with fewer queued, then the
        oldest request: a newly backlogged tenant is lifted to the others' counter), at most
        ``scan_depth`` per tenant, until a placeable one is found, then for warm
        alternatives within the locality slack. The request is *not* removed: call
        :meth:`remove` and :meth:`charge` when it is released.
        """
        order = sorted((t.counter, len(t.queue), t.queue[0].seq, tid) for tid, t in self._t.items() if t.queue)
        fair: Selection[T] | None = None
        fair_counter = 0.0
        for counter, _, _, tid in order:
            if fair is not None and counter > fair_counter + self.locality_slack_tokens:
                break
            for e in itertools.islice(self._t[tid].queue, self.scan_depth):
                p = place(e.item)
                if p is None:
                    continue
                if p == "warm":
                    return Selection(tid, e.item, "warm")
                if fair is None:
                    fair, fair_counter = Selection(tid, e.item, "cold"), counter
                break  # FIFO within a tenant: its later requests are not looked at for warmth
            if fair is not None and self.locality_slack_tokens == 0:
                break
        return fair
