"""A request in flow control's hands (gateway/flow.py): the record it waits in (:class:`Waiting`)
and what its release hands back to the pipeline (:class:`Release`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.admission import SlotClaim
from routing.load import LoadTicket
from routing.types import Candidate, RouteChoice, RouteRequest

__all__ = ["PendingRelease", "Release", "Waiting", "charge_released"]


@dataclass(frozen=True, slots=True)
class Release:
    """A request released to a replica: the router's ``choice`` and load ``ticket``,
    ``queue_wait_s`` (seconds queued at the gateway) and the tenant's ``virtual_tokens``
    (its VTC counter after the release, weighted tokens)."""

    choice: RouteChoice
    ticket: LoadTicket
    queue_wait_s: float
    virtual_tokens: float

    def commit(self) -> Release:
        """Itself: a release flow control has charged (:class:`PendingRelease`'s interface)."""
        return self

    def as_record(self) -> tuple[RouteChoice, LoadTicket, float, float]:
        """(choice, ticket, queue wait in ms, virtual tokens) rounded for the request record."""
        return self.choice, self.ticket, round(self.queue_wait_s * 1000.0, 3), round(self.virtual_tokens, 1)


class Waiting:
    """One request waiting for (or given) its release: its tenant and VTC ``weight``, the route
    request, its candidate replica ids and previous key versions' chains (``alt_chains``), and what
    the dispatcher decided (``result``, ``error``, ``room``: the candidates with room at its last
    placement check). ``slots``: the tenant's concurrency slots, taken at release (None: held)."""

    __slots__ = ("tenant_id", "weight", "req", "candidate_ids", "alt_chains", "t0", "future", "result", "room",
                 "error", "slots", "slot_pending", "charged", "position", "cands")

    def __init__(self, tenant_id: str, weight: float, req: RouteRequest, candidate_ids: list[str],
                 alt_chains: Sequence[Sequence[bytes]], slots: SlotClaim | None = None) -> None:
        self.tenant_id = tenant_id
        self.weight = weight
        self.req = req
        self.candidate_ids = candidate_ids
        self.alt_chains = alt_chains
        self.t0 = time.perf_counter()
        self.future: asyncio.Future[None] | None = None
        self.result: tuple[RouteChoice, LoadTicket] | None = None
        self.room: list[str] = []
        self.error: BaseException | None = None
        self.slots = slots  # the tenant's concurrency slots, taken at release
        self.slot_pending = False  # released, its slots still to be confirmed by Redis
        self.charged = 0  # uncached prompt tokens charged to the tenant's counter at release
        self.position: int | None = None  # arrival order in its tenant's queue (a release undone)
        self.cands: list[Candidate] | None = None  # the router's candidates its last placement check built


def charge_released(queue: Any, shares: Any, w: Waiting, choice: RouteChoice) -> None:
    """The tenant's virtual-token charge for ``w`` released to ``choice``: its uncached prompt tokens added
    to its counter in ``queue`` (:class:`routing.fairness.FairQueue`); ``shares`` (or None) touched when any."""
    w.charged = max(0, w.req.prompt_tokens - choice.predicted_prefix_tokens)
    queue.charge(w.tenant_id, w.charged)
    if w.charged and shares is not None:
        shares.touch(w.tenant_id, w.weight)


class PendingRelease:
    """A request flow control's fast path released and routed (``FlowControl.release_now(..., defer=True)``)
    whose charges are still to be made: ``choice`` (the router's) and ``queue_wait_s`` (as of the choice).

    :meth:`commit` makes them, in the order ``release_now`` makes them: the router's (:meth:`routing.router.Router.commit`:
    the replica's load ticket, the request's index record, its counters), then the tenant's virtual-token charge;
    it returns the :class:`Release`. Issue 14, session 30: the gateway commits right after its upstream write, with
    no await between the choice and the commit, so every other request sees the same loads, index and counters
    as with ``release_now(defer=False)``; the write no longer waits for that bookkeeping. Call it once; a request
    that fails between the choice and its commit (a bug: the commit never runs) charged nothing."""

    __slots__ = ("choice", "queue_wait_s", "_flow", "_w")

    def __init__(self, flow: Any, w: Waiting, choice: RouteChoice, queue_wait_s: float) -> None:
        self.choice = choice
        self.queue_wait_s = queue_wait_s
        self._flow = flow
        self._w = w

    def commit(self) -> Release:
        """The charges (class doc); returns the :class:`Release` ``release_now`` would have returned."""
        flow, w, choice = self._flow, self._w, self.choice
        ticket = flow.router.commit(w.req, choice)
        charge_released(flow.queue, flow.shares, w, choice)
        return Release(choice, ticket, self.queue_wait_s, flow.queue.counter(w.tenant_id))
