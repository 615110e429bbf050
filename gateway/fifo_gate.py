"""A FIFO gate in front of the pipeline's CPU work: at most ``limit`` requests between their admission and
their upstream send at once (session 24, finding S23-azure-2; ``flow.pipeline_slots``).

Why: since session 23 the listener accepts every waiting connection per wake-up
(gateway/accept_batch.py), so an overloaded gateway holds its whole backlog in one event loop. Without a
bound, every admitted request's pipeline (parse, prompt tokens, prefix keys, policy, route: ~1-3 ms of
CPU each) runs in the same loop iteration, back to back, and no replica's first byte is read until the
whole batch is done: every request of the batch gets its first byte after the batch (measured: with
the send-order yields removed, client TTFT p50 and p90 rose in the Azure cell). With the gate, a loop
iteration runs at most ``limit`` pipelines, then the loop polls its sockets (first bytes, relays, new
requests): requests reach their replicas in arrival order (FIFO), each as soon as its turn comes, not
all after the batch (for equal jobs FIFO has the lower mean and median response time than processor
sharing at the same throughput; Harchol-Balter, *Performance Modeling and Design of Computer Systems*,
2013, ch. 22-23).

Per-tenant fairness: a request enters the gate only after its tenant's own checks (rate and concurrency
limits, queue room, CPU budget) and after its whole body arrived (a slow body never holds a slot), and
the waiters are kept per tenant (FIFO within a tenant) and served round robin across tenants: one
tenant's burst waits behind itself, not in front of the other tenants' requests. A slot is given back at
the upstream send (or before the request waits in the flow queue, or when it ends before: refused,
cancelled); a waiter cancelled before its turn is removed, one cancelled just as its turn came gives the
slot on at once. Pure bookkeeping on the event loop's thread: no I/O, no clock.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine
from typing import Any, Protocol

__all__ = ["PipelineGate", "SlotHolder"]


class SlotHolder(Protocol):
    """What holds a slot: :class:`gateway.held.Held` (its ``gate`` attribute: the gate whose slot it holds)."""

    gate: PipelineGate | None


class PipelineGate:
    """At most ``limit`` (>= 1) slot holders at once; waiters served FIFO per tenant, round robin across tenants.

    ``holding``: slots taken; ``waiting``: requests waiting for one. Use from the event loop's thread.
    """

    __slots__ = ("limit", "holding", "waiting", "_queues", "_turns")

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self.holding = 0
        self.waiting = 0
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}  # per tenant id: its waiters, oldest first
        self._turns: deque[str] = deque()  # tenants with waiters, in round-robin order

    def enter(self, holder: SlotHolder, tenant_id: str) -> Coroutine[Any, Any, None] | None:
        """Take a slot for ``holder`` (``tenant_id``'s request): None when one was free and nobody waits
        (taken now, no coroutine); else a coroutine to await that returns when the slot is taken (then
        ``holder.gate`` is this gate). Cancelled while waiting: it holds nothing."""
        if self.holding < self.limit and not self.waiting:
            self.holding += 1
            holder.gate = self
            return None
        return self._wait(holder, tenant_id)

    async def _wait(self, holder: SlotHolder, tenant_id: str) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._queues.get(tenant_id)
        if queue is None:
            queue = self._queues[tenant_id] = deque()
            self._turns.append(tenant_id)
        queue.append(fut)
        self.waiting += 1
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():  # its turn came as it was cancelled: the slot goes on
                self.leave()
            else:
                self._forget(tenant_id, fut)
            raise
        holder.gate = self

    def _forget(self, tenant_id: str, fut: asyncio.Future[None]) -> None:
        queue = self._queues.get(tenant_id)
        if queue is not None and fut in queue:
            queue.remove(fut)
            self.waiting -= 1
            if not queue:
                del self._queues[tenant_id]
                self._turns.remove(tenant_id)

    def leave(self) -> None:
        """Give one slot back; the next waiter (the next tenant in turn, its oldest request) takes it."""
        self.holding -= 1
        while self._turns and self.holding < self.limit:
            tenant_id = self._turns.popleft()
            queue = self._queues[tenant_id]
            fut = queue.popleft()
            self.waiting -= 1
            if queue:
                self._turns.append(tenant_id)  # round robin: its next request after the other tenants'
            else:
                del self._queues[tenant_id]
            if not fut.done():
                self.holding += 1
                fut.set_result(None)
