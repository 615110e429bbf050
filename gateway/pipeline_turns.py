"""Turns of the event loop for admitted requests' pipelines: at most a few start per loop iteration, in
arrival order (session 24, finding S23-azure-2; ``flow.pipeline_turns``).

Why: since session 23 the listener accepts every waiting connection per wake-up (gateway/accept_batch.py),
so an overloaded gateway holds its whole backlog in one event loop. A request's pipeline from its
admission to its upstream send (parse, prompt tokens, prefix keys, policy, route: ~1-2 ms of CPU) runs in
one task step, so a loop iteration that starts N requests runs N pipelines back to back before the loop
polls its sockets again: no replica's first byte is read, no running stream relayed and no new request
read until the batch is done, so every request of the batch gets its first byte after the whole batch
(batch service). A concurrency bound cannot help: with no await between the bound and the send, a
request takes and gives back its place in the same step. :class:`PipelineTurns` bounds the pipelines that
start per loop iteration instead: the first ``per_iteration`` go on at once, the others wait and are let
through, oldest first, by a callback that runs once in each following iteration (after the loop polled),
so the replicas receive the requests in arrival order while first bytes and relays keep flowing (FIFO
service: for equal jobs a lower mean and median response time than processor sharing or batches at the
same throughput; Harchol-Balter, *Performance Modeling and Design of Computer Systems*, 2013, ch. 22-23).

Work-conserving and bounded: each iteration lets through at least ``per_iteration`` waiters and at least
a :data:`MAX_WAIT_ITERATIONS`-th of those waiting, so no request waits more than about that many
iterations and the queue never grows faster than the loop serves it.

Per-tenant fairness: a request waits only after its tenant's own checks (rate and concurrency limits,
queue room, CPU budget) and after its whole body arrived (a slow body never holds a turn), and the
waiters are kept per tenant (FIFO within a tenant) and let through round robin across tenants: one
tenant's burst waits behind itself, not in front of the others. A waiter cancelled before its turn is
removed; a turn is never held (nothing to give back). The wait is part of the audit's ``parse_ms``.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine
from typing import Any

__all__ = ["PipelineTurns", "MAX_WAIT_ITERATIONS"]

#: each iteration lets through at least this fraction (1/N) of the waiters: a wait of about N iterations at most
MAX_WAIT_ITERATIONS = 4


class PipelineTurns:
    """At most ``per_iteration`` (>= 1) pipelines start per event-loop iteration, waiters FIFO per tenant and
    round robin across tenants. ``started``: pipelines started in this iteration; ``waiting``: requests
    waiting for a turn. Use from the event loop's thread."""

    __slots__ = ("per_iteration", "started", "waiting", "_queues", "_turns", "_scheduled")

    def __init__(self, per_iteration: int) -> None:
        if per_iteration < 1:
            raise ValueError(f"per_iteration must be >= 1, got {per_iteration}")
        self.per_iteration = per_iteration
        self.started = 0
        self.waiting = 0
        self._queues: dict[str, deque[asyncio.Future[None]]] = {}  # per tenant id: its waiters, oldest first
        self._turns: deque[str] = deque()  # tenants with waiters, round-robin order
        self._scheduled = False

    def enter(self, tenant_id: str) -> Coroutine[Any, Any, None] | None:
        """A turn for ``tenant_id``'s request: None when it may start now (no coroutine), else a coroutine to
        await that returns in a later loop iteration, when its turn comes (raises CancelledError if cancelled)."""
        if self.started < self.per_iteration and not self.waiting:
            self.started += 1
            if not self._scheduled:
                self._schedule()
            return None
        return self._wait(tenant_id)

    def _schedule(self) -> None:
        self._scheduled = True
        asyncio.get_running_loop().call_soon(self._next_iteration)

    async def _wait(self, tenant_id: str) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._queues.get(tenant_id)
        if queue is None:
            queue = self._queues[tenant_id] = deque()
            self._turns.append(tenant_id)
        queue.append(fut)
        self.waiting += 1
        if not self._scheduled:
            self._schedule()
        try:
            await fut
        except asyncio.CancelledError:
            if not fut.done() or fut.cancelled():
                self._forget(tenant_id, fut)
            raise

    def _forget(self, tenant_id: str, fut: asyncio.Future[None]) -> None:
        queue = self._queues.get(tenant_id)
        if queue is not None and fut in queue:
            queue.remove(fut)
            self.waiting -= 1
            if not queue:
                del self._queues[tenant_id]
                self._turns.remove(tenant_id)

    def _next_iteration(self) -> None:
        """Once per loop iteration while requests start or wait: a new iteration's turns, the oldest waiters first."""
        self._scheduled = False
        self.started = 0
        quota = max(self.per_iteration, -(-self.waiting // MAX_WAIT_ITERATIONS))
        while self._turns and self.started < quota:
            tenant_id = self._turns.popleft()
            queue = self._queues[tenant_id]
            fut = queue.popleft()
            self.waiting -= 1
            if queue:
                self._turns.append(tenant_id)  # round robin: its next request after the other tenants'
            else:
                del self._queues[tenant_id]
            if not fut.done():
                fut.set_result(None)
                self.started += 1
        if self.started or self.waiting:
            self._schedule()
