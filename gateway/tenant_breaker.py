"""Per-(replica, tenant) attribution of replica failures (review R7b-1).

The replica's shared circuit (:class:`gateway.replicas.ReplicaSet`) counts gateway failures
(502/503/504, connect error, timeout, reset, broken answer). One tenant whose *input* makes the
engine fail that way (a "query of death" answered 503, or a dropped connection) would open every
replica's shared circuit for every tenant. So each failure is first offered to a
:class:`TenantBreaker`: when another tenant's last verdict on the same replica is a success no older
than ``window_s`` seconds, the replica is demonstrably serving others and the failure is
*attributed* to the failing tenant: it counts against the (replica, tenant) pair only, never against
the shared circuit. ``threshold`` consecutive attributed failures open a circuit for that pair for
``cooldown_s`` seconds (that tenant's requests are not routed to that replica); after the cool-down
the pair is routable again and one more failure re-opens it. A failure with no such evidence (one
tenant only, or every tenant failing: a real replica fault) is not attributed and counts against the
shared circuit as before.

Memory is bounded: per replica a :class:`cachetools.TTLCache` of at most ``max_tenants`` entries,
each expiring ``window_s + cooldown_s`` seconds after its last update. Pure logic, no I/O; the
``on_open(replica_id, tenant_id)`` callback (audit log line, metric) is called when a pair opens.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import TTLCache

__all__ = ["TenantBreaker", "TenantVerdict"]

#: default seconds a success of another tenant on the replica is evidence that the replica is fine
DEFAULT_WINDOW_S = 60.0
#: default bound on tracked tenants per replica
DEFAULT_MAX_TENANTS = 1024
#: seconds a recorded success stands before a later one is written again (per-request cost: one
#: TTLCache read instead of a read and a re-set; the evidence window is shortened by at most this)
REFRESH_S = 1.0


@dataclass(slots=True)
class _Entry:
    """One (replica, tenant) pair: its last verdict, failure streak and open-until time."""

    last_ok: bool = True
    last_at: float = 0.0
    streak: int = 0
    open_until: float = 0.0


@dataclass(frozen=True, slots=True)
class TenantVerdict:
    """What one failure meant. ``attributed``: counted against the (replica, tenant) pair only,
    not against the shared circuit; ``streak``: the pair's consecutive failures including this one;
    ``opened``: this failure opened the pair's circuit; ``retry``: the request may be retried on
    another replica (False once an attributed streak is 2 or more: one request must not spread its
    damage over every replica)."""

    attributed: bool
    streak: int
    opened: bool
    retry: bool


class TenantBreaker:
    """Consecutive failures per (replica, tenant), with per-pair circuits.

    ``threshold`` (>= 1) attributed consecutive failures open a pair for ``cooldown_s`` seconds;
    ``window_s``: how recent another tenant's success must be; ``max_tenants``: entries per replica;
    ``clock``: monotonic seconds. Tenant ``None`` (no tenant known) is never attributed.
    Raises :class:`ValueError` for a threshold below 1 or a negative time.
    """

    def __init__(self, threshold: int, cooldown_s: float, *, window_s: float = DEFAULT_WINDOW_S,
                 max_tenants: int = DEFAULT_MAX_TENANTS, clock: Callable[[], float] = time.monotonic,
                 on_open: Callable[[str, str], None] | None = None) -> None:
        if threshold < 1 or cooldown_s < 0 or window_s < 0 or max_tenants < 2:
            raise ValueError("threshold >= 1, cooldown_s >= 0, window_s >= 0, max_tenants >= 2 required")
        self.threshold, self.cooldown_s, self.window_s = threshold, cooldown_s, window_s
        self.max_tenants = max_tenants
        self.on_open = on_open
        self._clock = clock
        self._replicas: dict[str, TTLCache[str, _Entry]] = {}
        self.blocked_pairs = 0  # pairs ever opened (for tests and notes)
        self.open_until_max = 0.0  # no pair is open once the clock passes this (routing fast path)

    def _table(self, replica_id: str) -> TTLCache[str, _Entry]:
        table = self._replicas.get(replica_id)
        if table is None:
            table = self._replicas[replica_id] = TTLCache(self.max_tenants, self.window_s + self.cooldown_s,
                                                          timer=self._clock)
        return table

    def succeeded(self, replica_id: str, tenant_id: str | None) -> None:
        """``tenant_id``'s request got a non-failure answer from ``replica_id``: its streak ends.
        A success within :data:`REFRESH_S` of the pair's last recorded success (no failure between)
        changes nothing and is not written again."""
        if tenant_id is None:
            return
        now = self._clock()
        table = self._table(replica_id)
        entry = table.get(tenant_id)
        if entry is not None and entry.last_ok and now - entry.last_at < REFRESH_S:
            return  # nothing to change but a success time under REFRESH_S old: skip the TTLCache re-set
        entry = entry or _Entry()
        entry.last_ok, entry.last_at, entry.streak = True, now, 0
        table[tenant_id] = entry  # re-set: refreshes its expiry

    def failed(self, replica_id: str, tenant_id: str | None) -> TenantVerdict:
        """``tenant_id``'s request failed on ``replica_id`` (a gateway failure); returns the
        :class:`TenantVerdict`. Opens the pair (and calls ``on_open``) at ``threshold``."""
        if tenant_id is None:
            return TenantVerdict(False, 0, False, True)
        now = self._clock()
        table = self._table(replica_id)
        others_fine = any(t != tenant_id and e.last_ok and now - e.last_at <= self.window_s
                          for t, e in list(table.items()))
        entry = table.get(tenant_id) or _Entry()
        entry.last_ok, entry.last_at = False, now
        entry.streak += 1
        opened = False
        if others_fine and entry.streak >= self.threshold and entry.open_until <= now:
            entry.open_until, opened = now + self.cooldown_s, True
            self.open_until_max = max(self.open_until_max, entry.open_until)
            self.blocked_pairs += 1
        table[tenant_id] = entry
        if opened and self.on_open is not None:
            self.on_open(replica_id, tenant_id)
        return TenantVerdict(others_fine, entry.streak, opened, not (others_fine and entry.streak >= 2))

    def blocked(self, replica_id: str, tenant_id: str | None) -> bool:
        """True while the (``replica_id``, ``tenant_id``) circuit is open (its cool-down not over)."""
        if tenant_id is None:
            return False
        table = self._replicas.get(replica_id)
        entry = table.get(tenant_id) if table is not None else None
        return entry is not None and entry.open_until > self._clock()

    def any_open(self) -> bool:
        """True when some pair may still be open (O(1): the routing fast path asks it per request)."""
        return self.open_until_max > self._clock()

    def forget(self, replica_id: str) -> None:
        """Drop everything known about ``replica_id`` (removed, or restarted)."""
        self._replicas.pop(replica_id, None)
