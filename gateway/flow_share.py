"""One tenant's share of a replica's queued-prefill room (finding S25-newcomer-1, S15-4;
docs/fairness.md "Session 25: fairshare").

``flow.replica_max_queued_prefill_tokens`` bounds what one replica has queued, not who queued it:
one tenant alone could fill every replica's room, and another tenant's request, released first by
the fair queue, then waited behind that tenant's prefills on the replica (FIFO). The rule here is the
Virtual Token Counter's weighted share (Sheng et al., "Fairness in Serving Large Language Models",
OSDI'24) applied to the room: while another tenant is *active* (has a request queued, a prefill held
on any replica, or was seen within ``flow.tenant_share_idle_s``), a tenant may hold at most
``room x weight / (sum of the active tenants' weights)`` queued prefill tokens on one replica; a tenant
holding nothing on a replica may always place one request there (as an empty replica always takes one);
a tenant alone may use the whole room (work conservation). So a victim's request waits behind at most
the others' shares (plus one request each), i.e. about ``(1 - its share) x room / prefill rate``.

Cost: one dict lookup per placement check while the tenant holds nothing on a replica (the common
case); a counter per tenant per replica updated at dispatch and at the prefill's release; the set of
active tenants is looked through about once per ``tenant_share_idle_s``, not per request.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from routing.load import Notified
from routing.types import Candidate, ReplicaLoad

__all__ = ["TenantShares", "room_within_share", "share_tokens", "within_share"]


def share_tokens(room_tokens: int, weight: float, others_weight: float) -> float:
    """A tenant's share of one replica's room, in prefill tokens: ``room_tokens`` (tokens) times
    ``weight / (weight + others_weight)`` (the VTC weights of the tenant and of the other active
    tenants); the whole room when no other tenant is active (``others_weight <= 0``). Raises
    :class:`ValueError` for a non-positive ``weight``."""
    if weight <= 0:
        raise ValueError("a tenant's weight must be positive")
    if others_weight <= 0:
        return float(room_tokens)
    return room_tokens * weight / (weight + others_weight)


def within_share(held_tokens: int, uncached_tokens: int, room_tokens: int, weight: float,
                 others_weight: float) -> bool:
    """May a tenant holding ``held_tokens`` queued prefill tokens on a replica add a request of
    ``uncached_tokens`` there? Yes when it holds nothing there (one request always goes, however long:
    no starvation), when no other tenant is active (work conservation), or when the sum stays within
    :func:`share_tokens`. Pure; tokens are predicted uncached prompt tokens."""
    if held_tokens <= 0 or others_weight <= 0:
        return True
    return held_tokens + uncached_tokens <= share_tokens(room_tokens, weight, others_weight)


class _Hold:
    """One dispatched request's prefill tokens counted against its tenant on its replica: given back at
    the first release of its load ticket (the first byte, or the end without one: when the replica's
    queued prefill tokens are given back too), then ``notify.on_release()`` as the tracker would."""

    __slots__ = ("shares", "replica_id", "tenant_id", "tokens", "notify")

    def __init__(self, shares: TenantShares, replica_id: str, tenant_id: str, tokens: int, notify: Notified) -> None:
        self.shares = shares
        self.replica_id = replica_id
        self.tenant_id = tenant_id
        self.tokens = tokens
        self.notify = notify

    def on_release(self) -> None:
        if self.tokens:
            self.shares.give_back(self.replica_id, self.tenant_id, self.tokens)
            self.tokens = 0
        else:
            self.shares.touch(self.tenant_id)  # its request's end: active for tenant_share_idle_s more
        self.notify.on_release()


class TenantShares:
    """Per tenant, per replica queued prefill tokens of this gateway instance's dispatched requests, and
    which tenants are active (module doc). ``idle_s``: seconds a tenant stays active after its last
    request event (arrival in the queue, dispatch, first byte, end); ``queued(tenant_id)``: its
    requests waiting in the fair queue now (a waiting tenant stays active however long it waits);
    ``clock``: monotonic seconds. One event loop; not thread-safe."""

    __slots__ = ("idle_s", "queued", "clock", "held", "holding", "seen", "weights", "weight_sum", "next_check")

    def __init__(self, idle_s: float, queued: Callable[[str], int],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_s = idle_s
        self.queued = queued
        self.clock = clock
        self.held: dict[str, dict[str, int]] = {}  # tenant -> replica -> queued prefill tokens
        self.holding: dict[str, int] = {}  # tenant -> its requests whose prefill is still held
        self.seen: dict[str, float] = {}  # the active tenants -> last request event (clock s)
        self.weights: dict[str, float] = {}  # tenant -> its VTC weight as last seen
        self.weight_sum = 0.0  # the weights of the tenants in ``seen``
        self.next_check = 0.0  # clock s from which ``seen``'s oldest entry may have expired

    @classmethod
    def for_flow(cls, idle_s: float | None, max_prefill: int | None, queued: Callable[[str], int],
                 loads: Any) -> TenantShares | None:
        """The shares of a flow control whose room per replica is ``max_prefill`` tokens (None: no token
        bound, no share rule; ``idle_s`` None: rule off), counted by ``loads`` when it has ``count_shares``
        (gateway/flow_load.py ``NotifyingLoadTracker``); ``queued``: the fair queue's per-tenant count."""
        if max_prefill is None or idle_s is None:
            return None
        shares = cls(idle_s, queued)
        count = getattr(loads, "count_shares", None)
        if count is not None:
            count(shares)
        return shares

    def touch(self, tenant_id: str, weight: float | None = None) -> None:
        """``tenant_id`` had a request event now (``weight``: its VTC weight; None: as last given, and
        nothing for a tenant never given one or dropped by :meth:`forget`: a removed tenant's prefill that
        ends later does not make it active again, session 26 review26)."""
        weights = self.weights
        old = weights.get(tenant_id)
        if weight is None and old is None:
            return
        w = old if weight is None else weight
        if tenant_id not in self.seen:
            self.weight_sum += w
        elif old is not None and old != w:
            self.weight_sum += w - old
        if old != w:
            weights[tenant_id] = w
        self.seen[tenant_id] = self.clock()

    def take(self, replica_id: str, tenant_id: str, tokens: int, notify: Notified) -> _Hold:
        """Count ``tokens`` (> 0) queued prefill tokens of ``tenant_id`` on ``replica_id``; returns the
        object to pass as the load ticket's ``notify`` (it gives them back, then calls ``notify``)."""
        th = self.held.get(tenant_id)
        if th is None:
            th = self.held[tenant_id] = {}
        th[replica_id] = th.get(replica_id, 0) + tokens
        self.holding[tenant_id] = self.holding.get(tenant_id, 0) + 1
        return _Hold(self, replica_id, tenant_id, tokens, notify)

    def give_back(self, replica_id: str, tenant_id: str, tokens: int) -> None:
        """The prefill of a request counted by :meth:`take` is done (or ended): uncount it; the
        tenant stays active for ``idle_s`` from now."""
        th = self.held.get(tenant_id)
        if th is not None:
            v = th.get(replica_id, 0) - tokens
            if v > 0:
                th[replica_id] = v
            else:
                th.pop(replica_id, None)
                if not th:
                    del self.held[tenant_id]
        n = self.holding.get(tenant_id, 0) - 1
        if n > 0:
            self.holding[tenant_id] = n
        else:
            self.holding.pop(tenant_id, None)
        self.touch(tenant_id)

    def others_weight(self, tenant_id: str) -> float:
        """The summed weights of the active tenants other than ``tenant_id``. Tenants idle for more than
        ``idle_s`` leave the active set first, unless they still hold a prefill or have a request queued.
        The active set is looked through only when its oldest entry may have expired (``next_check``:
        the earliest last-seen time plus ``idle_s`` at the last look; events only move times later),
        so about once per ``idle_s``; otherwise one clock read and a subtraction."""
        seen = self.seen
        if seen:
            now = self.clock()
            if now >= self.next_check:
                self._expire(now)
        own = self.weights.get(tenant_id, 0.0) if tenant_id in seen else 0.0
        return max(0.0, self.weight_sum - own)

    def _expire(self, now: float) -> None:
        """Drop tenants idle past ``idle_s`` (a tenant holding a prefill or queued is seen now instead)."""
        seen, horizon, earliest = self.seen, now - self.idle_s, now
        for tid, t in list(seen.items()):
            if t >= horizon:
                earliest = min(earliest, t)
            elif tid in self.holding or self.queued(tid):
                seen[tid] = now  # still active
            else:
                del seen[tid]
                self.weight_sum -= self.weights.get(tid, 1.0)
        if not seen:
            self.weight_sum = 0.0  # no float drift once nobody is active
        self.next_check = earliest + self.idle_s

    def forget(self, keep: set[str]) -> None:
        """Drop the activity and the weight (not the held counts: their requests still end) of tenants not in
        ``keep``; each registry reload thus leaves no entry of a removed tenant (session 26, review26: an idle
        removed tenant's weight stayed)."""
        for tid in [t for t in self.weights if t not in keep]:
            w = self.weights.pop(tid)
            if self.seen.pop(tid, None) is not None:
                self.weight_sum -= w


def room_within_share(shares: TenantShares, tenant_id: str, weight: float, held: dict[str, int],
                      cands: list[Candidate], block_size: int, prompt_tokens: int, sequences: int,
                      has_room: Callable[[ReplicaLoad, int, int], bool], room_tokens: int) -> list[str]:
    """The ids of ``cands`` with room (``has_room(load, uncached tokens, sequences)``) for a request of
    ``prompt_tokens`` where ``tenant_id`` (VTC ``weight``), holding ``held`` queued prefill tokens per
    replica id, stays :func:`within_share` of ``room_tokens`` (the other active tenants' weight is
    asked of ``shares`` once, and only when the tenant holds tokens on a candidate)."""
    others: float | None = None
    room = []
    for c in cands:
        uncached = max(0, prompt_tokens - c.matched_blocks * block_size)
        if not has_room(c.load, uncached, sequences):
            continue
        h = held.get(c.replica_id, 0)
        if h:
            if others is None:
                others = shares.others_weight(tenant_id)
            if not within_share(h, uncached, room_tokens, weight, others):
                continue
        room.append(c.replica_id)
    return room
