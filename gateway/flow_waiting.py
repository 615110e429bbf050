"""A request in flow control's hands (gateway/flow.py): the record it waits in (:class:`Waiting`)
and what its release hands back to the pipeline (:class:`Release`)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.admission import SlotClaim
from routing.load import LoadTicket
from routing.types import Candidate, RouteChoice, RouteRequest

__all__ = ["Release", "Waiting"]


@dataclass(frozen=True, slots=True)
class Release:
    """A request released to a replica: the router's ``choice`` and load ``ticket``,
    ``queue_wait_s`` (seconds queued at the gateway) and the tenant's ``virtual_tokens``
    (its VTC counter after the release, weighted tokens)."""

    choice: RouteChoice
    ticket: LoadTicket
    queue_wait_s: float
    virtual_tokens: float

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
