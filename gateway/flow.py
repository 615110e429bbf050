"""Gateway-side flow control: per-tenant queues and the dispatcher that releases a request to a
replica only while one of its replicas has room, in fair order (issue 17; docs/fairness.md).

The order is :class:`routing.fairness.FairQueue` (weighted Virtual Token Counter, work-conserving,
locality-aware); this module is the asynchronous edge around it: a request waits on a future
until the dispatcher routes it (``Router.route`` among its candidates that have room), and the
dispatcher runs when a request arrives and whenever a replica's load is released (a first token
or the end of a request: :class:`NotifyingLoadTracker`). A queued request holds no replica load,
no breaker attempt, no upstream connection and no tenant concurrency slot (taken at release). Room is per gateway instance: each bound of
``flow`` is divided by ``flow.instances`` (shared counters are the scale-out work's, not yet).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

from gateway.admission import SlotClaim, too_many
from gateway.errors import GatewayError
from gateway.flow_bytes import QueuedBytes
from gateway.flow_load import NotifyingLoadTracker
from gateway.flow_room import ReplicaRoom, warmth
from gateway.flow_share import TenantShares, room_within_share
from gateway.flow_slots import SlotGate
from gateway.flow_waiting import PendingRelease, Release, Waiting, charge_released
from gateway.config_flow import FlowConfig
from gateway.metrics import GatewayMetrics
from gateway.periodic import PeriodicTask
from gateway.replicas import ReplicaSet
from routing.calibration import Calibration
from routing.fairness import FairQueue, Placement
from routing.router import Router
from routing.types import Candidate, RouteRequest
from tenancy.registry import Tenant
from tenancy.tiers import TierWeights

__all__ = ["FlowControl", "NotifyingLoadTracker", "PendingRelease", "Release", "RECHECK_S", "Waiting"]

#: seconds between rechecks of the queue while requests wait (besides every load release)
RECHECK_S = 0.25
_FULL = "this tenant has too many requests waiting; retry later"


class FlowControl:
    """Per-tenant queues in front of the router (module doc). ``cfg``: the ``flow`` section;
    ``calibration`` (optional): engine samples for ``replica_max_engine_waiting_requests``."""

    def __init__(self, cfg: FlowConfig, router: Router, replica_set: ReplicaSet, metrics: GatewayMetrics,
                 weights: TierWeights, calibration: Calibration | None = None) -> None:
        self.cfg = cfg
        self.router = router
        self.replica_set = replica_set
        self.metrics = metrics
        self.weights = weights
        self.calibration = calibration
        self.queue: FairQueue[Waiting] = FairQueue(locality_slack_tokens=cfg.locality_slack_tokens)
        self.replica_room = ReplicaRoom(cfg, calibration)  # per-replica bounds (gateway/flow_room.py)
        self._max_prefill = self.replica_room.max_prefill
        # one tenant's share of a replica's prefill room (S25-newcomer-1; gateway/flow_share.py)
        self.shares = TenantShares.for_flow(cfg.tenant_share_idle_s, self._max_prefill, self.queue.queued, router.loads)
        self._pump_scheduled = False
        self.slot_gate = SlotGate()  # tenants skipped for want of a concurrency slot
        self.queued_bytes = QueuedBytes(cfg.tenant_max_queued_bytes)  # R12-2 (gateway/flow_bytes.py)
        # room also appears without a load release (a replica back to health, an engine that
        # drained its own queue): look again now and then while anything waits
        self._tick = PeriodicTask(self._tick_round, RECHECK_S, "flow-control recheck")

    async def start(self) -> None:
        """Start the periodic recheck (a :class:`gateway.build.Lifecycle`)."""
        self._tick.start()

    async def stop(self) -> None:
        """Stop the periodic recheck."""
        await self._tick.stop()

    async def _tick_round(self) -> None:
        self.slot_gate.recheck()  # other instances may have freed slots
        if self.queue.size:
            self._pump()

    # -- state for policy, metrics, audit ---------------------------------------------------------
    def tenant_queued(self, tenant_id: str) -> int:
        """Requests of ``tenant_id`` queued now."""
        return self.queue.queued(tenant_id)

    def refresh_gauges(self) -> None:
        """Queue length (total: public; per tenant: admin) and virtual counters (admin), before a scrape."""
        m = self.metrics
        m.flow_queued.set(len(self.queue))
        for tid, c in self.queue.counters().items():
            m.tenant_queued.labels(tid).set(self.queue.queued(tid))
            m.tenant_virtual_tokens.labels(tid).set(c)

    def charge_output(self, tenant: str, output_tokens: int) -> None:
        """A released request ended having produced ``output_tokens``: add them to its tenant's counter."""
        self.queue.charge(tenant, output_tokens)

    def forget(self, keep: set[str]) -> None:
        """Drop counters of tenants removed by a registry reload."""
        self.queue.forget(keep)
        if self.shares is not None:
            self.shares.forget(keep)

    # -- the request's side ---------------------------------------------------------------------
    def check_queue_room(self, tenant_id: str) -> None:
        """Refuse at the door (429 ``queue_full``, before the body is read) a request of a tenant
        whose queue is already at ``tenant_max_queued_requests``: it would only wait behind its own."""
        queued = self.queue.queued(tenant_id)
        if queued and queued >= self.cfg.tenant_max_queued_requests:
            self.metrics.flow_refused.labels("queue_full").inc()
            raise self._refusal(too_many(self._retry_after(), "queue_full", _FULL), tenant_id, 0.0)

    def release_now(self, tenant: Tenant, req: RouteRequest, candidate_ids: list[str],
                    alt_chains: Sequence[Sequence[bytes]], slots: SlotClaim | None = None,
                    defer: bool = False) -> Release | PendingRelease | None:
        """:meth:`release` when it needs no wait: nothing is queued, a replica among ``candidate_ids``
        has room now and the tenant a slot without asking Redis. Returns the :class:`Release`, or None
        when the request must wait: then call :meth:`release` with ``tried=True`` (it queues the
        request without checking again). Synchronous (issue 14): the common case costs no coroutine
        and no disconnect watch, as nothing is awaited. Raises what :meth:`release` raises at once
        (503 ``no_replica`` when routing failed). ``defer`` (session 30): a :class:`PendingRelease` instead."""
        if self.queue.size:
            return None
        w = Waiting(tenant.id, self.weights.weight(tenant.tier), req, candidate_ids, alt_chains, slots)
        if not self._release_now(w, defer):
            return None
        if w.error is not None:  # :meth:`_released`'s steps inline (session 14: one frame less)
            raise w.error
        choice, ticket = w.result  # type: ignore[misc]
        if ticket is None:  # defer: the queue wait as of the choice, as a Release's
            return PendingRelease(self, w, choice, time.perf_counter() - w.t0)
        return Release(choice, ticket, time.perf_counter() - w.t0, self.queue.counter(w.tenant_id))

    def _released(self, w: Waiting) -> Release:
        """The :class:`Release` of ``w``, routed (raises its routing error); its queue wait goes to
        the metric by :meth:`observe_wait` (the pipeline's, while the replica works: session 11)."""
        if w.error is not None:
            raise w.error
        assert w.result is not None
        choice, ticket = w.result
        return Release(choice, ticket, time.perf_counter() - w.t0, self.queue.counter(w.tenant_id))

    def observe_wait(self, queue_wait_s: float) -> None:
        """A released request's :attr:`Release.queue_wait_s` into the queue-wait histogram."""
        self.metrics.flow_queue_wait.observe(queue_wait_s)

    async def release(self, tenant: Tenant, req: RouteRequest, candidate_ids: list[str],
                      alt_chains: Sequence[Sequence[bytes]], deadline: float,
                      slots: SlotClaim | None = None, *, tried: bool = False, body_bytes: int = 0) -> Release:
        """Wait for ``req``'s turn and a replica with room among ``candidate_ids``; route it there.

        ``deadline``: ``time.perf_counter()`` time by which the request must be sent
        (``upstream.total_timeout_s`` from arrival). ``slots``: the tenant's concurrency slots
        (``req.sequences`` of them), taken only when the request leaves the queue; a tenant at
        its concurrency keeps its requests queued, in fair order, until a slot frees (None: the
        caller holds them already). Raises 429 ``queue_full`` (the tenant has
        ``tenant_max_queued_requests`` queued), 429 ``queue_timeout`` (waited
        ``tenant_max_queue_wait_s``), 504 ``upstream_timeout`` (the deadline passed while queued),
        503 ``state_unavailable`` (Redis did not answer for the slot).
        Cancelled (the client left): the request leaves the queue at once. ``tried``: :meth:`release_now`
        just answered None for this request (no await since): queue it without that check again.
        ``body_bytes``: what the request holds while it waits (its body's length), counted against
        ``tenant_max_queued_bytes`` while it is queued (429 ``queue_full`` beyond it; review R12-2).
        """
        cfg, tid = self.cfg, tenant.id
        w = Waiting(tid, self.weights.weight(tenant.tier), req, candidate_ids, alt_chains, slots)
        counted = 0
        if tried or self.queue.size or not self._release_now(w):
            self.queue.push(tid, w, w.weight)
            if self.shares is not None:
                self.shares.touch(tid, w.weight)  # waiting: the others hold at most their shares
            self._pump()
            if w.result is None and w.error is None:
                if self.queue.queued(tid) > cfg.tenant_max_queued_requests:
                    self.queue.remove(tid, w)  # it would wait behind too many of its own
                    raise self._queue_full(tid)
                if body_bytes:
                    if not self.queued_bytes.take(tid, body_bytes):
                        self.queue.remove(tid, w)  # its queued requests hold too many bytes (R12-2)
                        raise self._bytes_full(tid)
                    counted = body_bytes
        try:
            ends = time.perf_counter() + min(cfg.tenant_max_queue_wait_s, deadline - time.perf_counter())
            while True:
                if w.result is None and w.error is None:
                    await self._wait(w, ends, deadline)
                if w.error is not None:
                    raise w.error
                assert w.result is not None
                if not w.slot_pending or await self._confirm_slots(w):
                    break
        finally:
            if counted:  # however it leaves the queue: released, refused, timed out, cancelled
                self.queued_bytes.give_back(tid, counted)
        return self._released(w)

    async def _wait(self, w: Waiting, ends: float, deadline: float) -> None:
        """Wait (until ``ends``) for the dispatcher to release ``w``; the refusals of :meth:`release`."""
        cfg, tid = self.cfg, w.tenant_id
        w.future = asyncio.get_running_loop().create_future()
        try:
            async with asyncio.timeout(max(0.0, ends - time.perf_counter())):
                await w.future
        except TimeoutError:
            if self.queue.remove(tid, w):
                by_wait = cfg.tenant_max_queue_wait_s <= deadline - w.t0 - 1e-9
                self.metrics.flow_refused.labels("queue_timeout" if by_wait else "deadline").inc()
                err = (too_many(self._retry_after(), "queue_timeout", "the request waited too long for a replica; "
                                "retry later") if by_wait else GatewayError(504, "upstream_timeout",
                       "no replica had room (or the tenant no free slot) before the deadline"))
                raise self._refusal(err, tid, time.perf_counter() - w.t0) from None
        except BaseException:
            if not self.queue.remove(tid, w) and w.result is not None:
                w.result[1].finish()  # released as the client left: give the load back
                if w.slot_pending:
                    self._asked(tid, None)
            raise

    async def _confirm_slots(self, w: Waiting) -> bool:
        """A request released while its slots needed Redis's answer: True when taken; when the
        tenant is at its concurrency (other instances hold the slots) give the replica load and
        the counter charge back and put the request back in its place in its tenant's queue
        (retried at the next recheck): False."""
        assert w.result is not None and w.slots is not None
        try:
            ok = await w.slots.take(w.req.sequences)
        except BaseException:
            w.result[1].finish()
            self._asked(w.tenant_id, None)
            raise
        self._asked(w.tenant_id, ok)
        w.slot_pending = False
        if ok:
            return True
        ticket = w.result[1]
        w.result = None
        self.queue.put_back(w.tenant_id, w, w.charged, w.position)
        ticket.finish()  # the replica's room goes to others meanwhile
        if self.queue.queued(w.tenant_id) > self.cfg.tenant_max_queued_requests:
            self.queue.remove(w.tenant_id, w)
            raise self._queue_full(w.tenant_id)
        return False

    def _asked(self, tenant_id: str, granted: bool | None) -> None:
        """A slot request to Redis of ``tenant_id`` ended (:meth:`SlotGate.asked`): look again."""
        self.slot_gate.asked(tenant_id, granted)
        self.on_load_released()

    def _queue_full(self, tenant_id: str) -> GatewayError:
        """The refusal of a request that cannot wait: 429 ``concurrency_limited`` when its tenant
        is at ``max_concurrency`` (it waits for a slot, not for a replica), else ``queue_full``."""
        if self.slot_gate.at_concurrency(tenant_id):
            self.metrics.flow_refused.labels("concurrency").inc()
            err = too_many(1.0, "concurrency_limited",
                           "tenant concurrent request limit reached and no room in its queue")
            return self._refusal(err, tenant_id, 0.0)
        return self._bytes_full(tenant_id)

    def _bytes_full(self, tenant_id: str) -> GatewayError:
        """The 429 ``queue_full`` of a full queue, also for a request whose body would take its tenant's
        queued requests past ``tenant_max_queued_bytes`` (R12-2): same shape, metric and audit figures."""
        self.metrics.flow_refused.labels("queue_full").inc()
        return self._refusal(too_many(self._retry_after(), "queue_full", _FULL), tenant_id, 0.0)

    def _refusal(self, err: GatewayError, tenant_id: str, waited_s: float) -> GatewayError:
        """``err`` with the queue figures its audit event records (:attr:`GatewayError.record`):
        ``queue_wait_ms`` (``waited_s`` queued), the tenant's ``virtual_tokens`` and, as the
        event's ``policy.reason``, its queue length against its bound (and the wait bound)."""
        q = self.queue.queued(tenant_id)
        err.record = {"queue_wait_ms": round(waited_s * 1000.0, 3),
                      "virtual_tokens": round(self.queue.counter(tenant_id), 1),
                      "reason": f"{q} queued (bound {self.cfg.tenant_max_queued_requests}), "
                                f"wait bound {self.cfg.tenant_max_queue_wait_s:g} s"}
        return err

    def _retry_after(self) -> float:
        """Retry-After for a queue refusal: about the queue wait bound's half, at least 1 s."""
        return max(1.0, math.ceil(self.cfg.tenant_max_queue_wait_s / 2))

    # -- the dispatcher ------------------------------------------------------------------------
    def on_load_released(self) -> None:
        """A replica gained room: run the dispatcher soon (coalesced; outside the caller's frame)."""
        if self._pump_scheduled or not self.queue.size:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._pump()
            return
        self._pump_scheduled = True
        loop.call_soon(self._pump)

    def _pump(self) -> None:
        """Release queued requests in fair order while any can be placed."""
        self._pump_scheduled = False
        self.slot_gate.new_round()
        routable = self.replica_set.routable_set()
        while self.queue.size:
            sel = self.queue.select(lambda w: self._place(w, routable))
            if sel is None:
                return
            w = sel.item
            if w.slots is not None:  # the tenant's concurrency slots are taken now, not at admission
                got = w.slots.take_now(w.req.sequences)
                if got is False:  # at its concurrency: it stays queued, its tenant skipped this round
                    self.slot_gate.refused_now(w.tenant_id)
                    continue
                w.slot_pending = got is None
                if got:
                    w.slots = None
                else:
                    self.slot_gate.asking(w.tenant_id)
                    w.position = self.queue.position(w.tenant_id, w)
            self.queue.remove(w.tenant_id, w)
            self._route(w)
            if w.future is not None and not w.future.done():
                w.future.set_result(None)

    def _release_now(self, w: Waiting, defer: bool = False) -> bool:
        """The fast path while nothing is queued: release ``w`` at once where the dispatcher would
        (same placement, slot and counters: :meth:`FairQueue.pass_through`), without the queue.
        False: ``w`` must be queued (no room, no slot, or a slot that needs Redis's answer)."""
        slots = w.slots
        if slots is not None and not slots.local:
            return False
        self.slot_gate.new_round()
        if self._place(w, self.replica_set.routable_set()) is None:
            return False
        if slots is not None:
            if not slots.take_now(w.req.sequences):
                return False  # at its concurrency: it waits in its queue for a slot
            w.slots = None
        self.queue.pass_through(w.tenant_id, w.weight)
        self._route(w, w.cands, defer)  # nothing awaited or routed since the placement check built them
        return True

    def _route(self, w: Waiting, cands: list[Candidate] | None = None, defer: bool = False) -> None:
        """Route the released ``w`` among ``w.room``: its result and counter charge, or its error.
        ``cands``: the router's candidates for ``w.candidate_ids`` built with no routing since
        (:meth:`_release_now`); those in ``w.room`` are routed among, not built again (issue 14).
        ``defer``: the choice only, ``(choice, None)``, charged by :meth:`PendingRelease.commit`."""
        try:  # = Router.route / route_among, the charge made here unless deferred
            if cands is None:
                choice = self.router.choose(w.req, w.room, w.alt_chains)
            else:
                room = set(w.room)
                choice = self.router.choose_among(w.req, [c for c in cands if c.replica_id in room])
            ticket = None if defer else self.router.commit(w.req, choice)
        except Exception as exc:  # a bug or a vanished replica: the request answers, the queue goes on
            if w.slot_pending:
                self._asked(w.tenant_id, None)
            w.error = GatewayError(503, "no_replica", "no healthy replica is allowed for this request")
            w.error.__cause__ = exc
        else:
            w.result = (choice, ticket)
            if ticket is not None:
                charge_released(self.queue, self.shares, w, choice)

    def _place(self, w: Waiting, routable: frozenset[str]) -> Placement:
        """Where ``w`` could go now (:data:`routing.fairness.Placement`); sets ``w.room``."""
        w.cands = None
        if w.slots is not None and self.slot_gate.skipped(w.tenant_id):
            return None
        ids = []  # loops, not comprehensions: no frame each (issue 14, session 15)
        for rid in w.candidate_ids:
            if rid in routable:
                ids.append(rid)
        if not ids:
            return None
        if self._max_prefill is None:
            snapshot, has_room, seqs = self.router.loads.snapshot, self.replica_room.has_room, w.req.sequences
            room = []
            for rid in ids:
                if has_room(snapshot(rid), 0, seqs):
                    room.append(rid)
            if not room:
                return None
            w.room = room
            if len(room) == len(ids):
                return "warm"
            cands = w.cands = self.router.candidates(w.req, ids, w.alt_chains)
        else:
            cands = w.cands = self.router.candidates(w.req, ids, w.alt_chains)
            bs = self.router.block_size
            has_room, prompt, seqs = self.replica_room.has_room, w.req.prompt_tokens, w.req.sequences
            shares = self.shares
            held = shares.held.get(w.tenant_id) if shares is not None else None
            if held is None:  # the tenant holds no prefill anywhere: no share to check (one lookup)
                room = [c.replica_id for c in cands if has_room(c.load, max(0, prompt - c.matched_blocks * bs), seqs)]
            else:
                assert shares is not None
                room = room_within_share(shares, w.tenant_id, w.weight, held, cands, bs, prompt, seqs, has_room,
                                         self._max_prefill)
            if not room:
                return None
            w.room = room
        return warmth(cands, set(room), self.router.block_size, w.req.prompt_tokens, self._max_prefill,
                      self.cfg.locality_wait_ratio)
