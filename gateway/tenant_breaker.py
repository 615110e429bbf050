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
the pair is routable again and one more failure re-opens it. A failure while another tenant's last
verdict on the replica (within ``window_s``) is a failure too, and none a success, is the replica's:
it counts against the shared circuit (a real fault shows in several tenants' requests), as does a
failure of no known tenant. A failure with no other tenant seen on the replica within ``window_s``
(start-up, or a replica only one tenant uses) is *held* against the pair as well (session 8, the
R7b-1 residual): the shared circuit opens only on failures of two or more tenants, as Envoy's outlier
detection keeps locally originated failures apart; a held failure may still be retried elsewhere.

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


class _Pairs(TTLCache):  # type: ignore[type-arg]
    """One replica's pairs: a :class:`cachetools.TTLCache` that also keeps the entries it holds in a
    plain dict (:attr:`held`, tenant id → entry), updated on every write and every removal (expiry,
    eviction, deletion), so the success fast path reads one dict instead of the cache's timed,
    reordering ``get``: an entry in ``held`` is the one in the cache."""

    def __init__(self, maxsize: int, ttl: float, timer: Callable[[], float]) -> None:
        super().__init__(maxsize, ttl, timer=timer)
        self.held: dict[str, _Entry] = {}

    def __setitem__(self, key: str, value: _Entry) -> None:
        super().__setitem__(key, value)
        self.held[key] = value

    def __delitem__(self, key: str) -> None:
        self.held.pop(key, None)
        super().__delitem__(key)

    def expire(self, time: float | None = None) -> list[tuple[str, _Entry]]:
        items = list(super().expire(time))
        for key, _ in items:
            self.held.pop(key, None)
        return items

    def popitem(self) -> tuple[str, _Entry]:
        key, value = super().popitem()
        self.held.pop(key, None)
        return key, value


@dataclass(frozen=True, slots=True)
class TenantVerdict:
    """What one failure meant. ``attributed``: counted against the (replica, tenant) pair only,
    not against the shared circuit; ``streak``: the pair's consecutive failures including this one;
    ``opened``: this failure opened the pair's circuit; ``retry``: the request may be retried on
    another replica (False once an attributed streak with ``evidence`` is 2 or more: one request must
    not spread its damage over every replica); ``evidence``: another tenant's last verdict on the
    replica is a recent success (False with ``attributed``: held, no other tenant seen; module doc)."""

    attributed: bool
    streak: int
    opened: bool
    retry: bool
    evidence: bool = False


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
        self._replicas: dict[str, _Pairs] = {}
        # a success within REFRESH_S of the last written one is the fast path's: its entry cannot
        # have expired meanwhile when entries live at least that long (window + cool-down)
        self._fast = window_s + cooldown_s >= REFRESH_S
        self.blocked_pairs = 0  # pairs ever opened (for tests and notes)
        self.open_until_max = 0.0  # no pair is open once the clock passes this (routing fast path)

    def _table(self, replica_id: str) -> _Pairs:
        table = self._replicas.get(replica_id)
        if table is None:
            table = self._replicas[replica_id] = _Pairs(self.max_tenants, self.window_s + self.cooldown_s,
                                                        self._clock)
        return table

    def succeeded(self, replica_id: str, tenant_id: str | None) -> None:
        """``tenant_id``'s request got a non-failure answer from ``replica_id``: its streak ends.
        A success within :data:`REFRESH_S` of the pair's last recorded success (no failure between)
        changes nothing and is not written again (nor read from the TTLCache, so it does not move
        the pair in the cache's LRU order: under more than ``max_tenants`` tenants on one replica,
        a pair answered steadily may be evicted up to :data:`REFRESH_S` sooner, then written again)."""
        if tenant_id is None:
            return
        now = self._clock()
        table = self._table(replica_id)
        if self._fast:  # issue 14: one dict read, not the TTLCache's timed get (~5 µs)
            held = table.held.get(tenant_id)
            if held is not None and held.last_ok and now - held.last_at < REFRESH_S:
                return  # written under REFRESH_S ago, still in the cache (held), no failure since
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
        others_fine = others_failing = False
        for t, e in list(table.items()):
            if t != tenant_id and now - e.last_at <= self.window_s:
                if e.last_ok:
                    others_fine = True
                else:
                    others_failing = True
        attributed = others_fine or not others_failing  # with evidence, or held: no other tenant seen
        entry = table.get(tenant_id) or _Entry()
        entry.last_ok, entry.last_at = False, now
        entry.streak += 1
        opened = False
        if attributed and entry.streak >= self.threshold and entry.open_until <= now:
            entry.open_until, opened = now + self.cooldown_s, True
            self.open_until_max = max(self.open_until_max, entry.open_until)
            self.blocked_pairs += 1
        table[tenant_id] = entry
        if opened and self.on_open is not None:
            self.on_open(replica_id, tenant_id)
        return TenantVerdict(attributed, entry.streak, opened, not (others_fine and entry.streak >= 2), others_fine)

    def blocked(self, replica_id: str, tenant_id: str | None) -> bool:
        """True while the (``replica_id``, ``tenant_id``) circuit is open (its cool-down not over)."""
        if tenant_id is None:
            return False
        table = self._replicas.get(replica_id)
        entry = table.get(tenant_id) if table is not None else None
        return entry is not None and entry.open_until > self._clock()

    def streak(self, replica_id: str, tenant_id: str) -> int:
        """The (``replica_id``, ``tenant_id``) pair's consecutive failures (0 when not tracked)."""
        table = self._replicas.get(replica_id)
        entry = table.get(tenant_id) if table is not None else None
        return entry.streak if entry is not None else 0

    def any_open(self) -> bool:
        """True when some pair may still be open (O(1): the routing fast path asks it per request)."""
        return self.open_until_max > self._clock()

    def forget(self, replica_id: str) -> None:
        """Drop everything known about ``replica_id`` (removed, or restarted)."""
        self._replicas.pop(replica_id, None)
