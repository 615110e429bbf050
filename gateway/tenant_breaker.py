"""Per-(replica, tenant) attribution of replica failures (reviews R7b-1, R8-2, R8-4, R9-2).

The replica's shared circuit (:class:`gateway.replicas.ReplicaSet`) counts gateway failures
(502/503/504, connect error, timeout, reset, broken answer). One tenant whose *input* makes the
engine fail that way (a "query of death" answered 503, or a dropped connection) must not open a
replica's shared circuit for every tenant. So each failure is first offered to a
:class:`TenantBreaker`, which decides whose failure it is:

* **corroborated** (the replica's): another tenant's last verdict on the same replica is also a
  gateway failure, no older than ``window_s`` seconds and later than the replica's last 2xx answer
  (to any tenant). Failures of two distinct tenants' inputs with nothing served between them are
  evidence against the replica: the failure counts against the shared circuit (and the pair's
  streak). A failure with no tenant known is always the replica's.
* otherwise **attributed** (the pair's): it counts against the (replica, tenant) pair only, never
  against the shared circuit — also when nothing is known about other tenants (start-up, a quiet
  replica: review R8-2; session 7 attributed only while another tenant's success was <= 60 s old,
  so one tenant alone opened every shared circuit). ``threshold`` consecutive failures of the pair,
  or ``threshold`` attributed failures of the pair within ``window_s`` seconds *whatever 2xx answers
  came between* (review R9-2: one valid request after each poison one ended the streak, so the pair
  never opened and the poison reached the replica at the tenant's full rate), open a circuit for
  that pair for ``cooldown_s`` seconds (that tenant's requests are not routed to that replica);
  after the cool-down the pair is routable again and one more failure re-opens it while
  ``threshold`` of its attributed failures are still within the window (or its streak was not
  ended). A tenant meeting ``threshold`` attributed failures within the window on a replica, among
  any number of 2xx answers, thus avoids that replica for the cool-down (for a replica flaky for that
  tenant alone, the outlier ejection it would get anyway; corroborated failures were the replica's
  and do not add up here).
  A real fault seen by one tenant alone thus takes the replica out for that tenant (it is
  protected); since session 10 its pair's opening makes the gateway verify the replica with a
  request of its own, which opens the shared circuit if it fails too; a second tenant's failure there
  corroborates, and opens the shared circuit once the gateway's own verification request fails as
  well (S9-L4: two colluding tenants corroborate each other; gateway/replica_verify.py), and the
  active health check (gateway/health.py) marks a
  replica whose ``/health`` fails down for everyone. While the gateway's verification of a replica
  stands as passed (``failed(..., vouched=True)``) no failure there is corroborated.

Only a **2xx** answer (``succeeded(..., served=True)``) is evidence that the replica serves: it ends
the tenant's streak (not its failures within the window, R9-2) and voids earlier failures as
corroboration. Any other answer that is not a
gateway failure (4xx, 429, a plain 500: ``served=False``) proves the HTTP server alive, not the
engine: it is neither evidence nor a reset of the tenant's streak (review R8-4: a tenant's 400s from
a broken replica made every other tenant's failures there "its own", and unretried).

Retry: an attributed failure is not retried on another replica once the pair's streak is 2 or more
*and* another tenant got a 2xx on that replica within ``window_s`` (the input is then the likely
cause; one request must not spread its damage over every replica). Without that evidence (one
tenant alone: a poison input and a real fault look alike) the failure may be retried, as a shared
failure may.

Memory is bounded: per replica a :class:`cachetools.TTLCache` of at most ``max_tenants`` entries
(each with at most ``threshold`` failure times), each expiring ``window_s + cooldown_s`` seconds after
its last update, plus one int per replica.
Pure logic, no I/O; the ``on_open(replica_id, tenant_id)`` callback (audit log line, metric) is
called when a pair opens. Compare Envoy's outlier detection (``consecutive_gateway_failure``,
``split_external_local_origin_errors``): it ejects a host on consecutive failures whatever request
caused them (and is bypassed by interleaved successes the same way; its ``failure_percentage``
detection is the ratio form of the window count); it has no notion of whose request failed
(docs/routing.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from cachetools import TTLCache

__all__ = ["TenantBreaker", "TenantVerdict", "DEFAULT_WINDOW_S"]

#: default seconds a tenant's verdict on a replica stands as evidence (a 2xx: the replica serves
#: others; a failure: corroborates another tenant's failure). Config ``health.breaker_tenant_window_s``
DEFAULT_WINDOW_S = 60.0
#: default bound on tracked tenants per replica
DEFAULT_MAX_TENANTS = 1024
#: seconds a recorded success stands before a later one is written again (per-request cost: one
#: TTLCache read instead of a read and a re-set; the evidence window is shortened by at most this)
REFRESH_S = 1.0


@dataclass(slots=True)
class _Entry:
    """One (replica, tenant) pair: its last verdict (2xx or gateway failure), failure streak, open-until
    time and the times of its last ``threshold`` attributed failures (oldest first; R9-2)."""

    last_ok: bool = True
    last_at: float = 0.0
    streak: int = 0
    open_until: float = 0.0
    seq: int = 0  # the breaker's verdict number of its last failure (orders it against 2xx answers)
    failures: list[float] = field(default_factory=list)  # not reset by a 2xx (R9-2)


@dataclass(frozen=True, slots=True)
class TenantVerdict:
    """What one failure meant. ``attributed``: counted against the (replica, tenant) pair only,
    not against the shared circuit (False: corroborated by another tenant's failure, or no tenant);
    ``streak``: the pair's consecutive failures including this one; ``opened``: this failure opened
    the pair's circuit; ``retry``: the request may be retried on another replica (False once an
    attributed streak is 2 or more while another tenant is served there)."""

    attributed: bool
    streak: int
    opened: bool
    retry: bool


class TenantBreaker:
    """Failures per (replica, tenant), with per-pair circuits (see module doc).

    ``threshold`` (>= 1) consecutive failures, or ``threshold`` failures within ``window_s`` whatever
    2xx came between, open the pair (when the failure is attributed) for ``cooldown_s`` seconds;
    ``window_s``: how long a tenant's last verdict stands as evidence and the span over which its
    failures add up; ``max_tenants``: entries per
    replica; ``clock``: monotonic seconds. Tenant ``None`` (no tenant known) is never attributed.
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
        self._seq = 0  # verdicts numbered in order: "later than the last 2xx" without clock ties
        self._served_seq: dict[str, int] = {}  # replica -> number of its last 2xx (any tenant)
        self.blocked_pairs = 0  # pairs ever opened (for tests and notes)
        self.open_until_max = 0.0  # no pair is open once the clock passes this (routing fast path)

    def _table(self, replica_id: str) -> TTLCache[str, _Entry]:
        table = self._replicas.get(replica_id)
        if table is None:
            table = self._replicas[replica_id] = TTLCache(self.max_tenants, self.window_s + self.cooldown_s,
                                                          timer=self._clock)
        return table

    def succeeded(self, replica_id: str, tenant_id: str | None, served: bool = True) -> None:
        """``tenant_id``'s request got an answer from ``replica_id`` that is not a gateway failure.
        ``served`` (a 2xx answer, or the first byte of a 200 stream): evidence that the replica
        serves, and the tenant's streak ends. ``served=False`` (4xx, 429, a plain 500): changes
        nothing here (R8-4). A success within :data:`REFRESH_S` of the pair's last recorded success
        (no failure between) is not written again."""
        if not served:
            return
        self._seq += 1
        self._served_seq[replica_id] = self._seq
        if tenant_id is None:
            return
        now = self._clock()
        table = self._replicas.get(replica_id)  # _table's lookup inline (one call per answer less)
        if table is None:
            table = self._table(replica_id)
        try:  # session 26 (issue 14): one TTLCache lookup; Cache.get's ``in`` and ``[]`` cost two timer
            entry = table[tenant_id]  # reads and four more Python calls. Same LRU touch on a live entry
        except KeyError:  # absent or expired (an expired one goes at the re-set's expire(), as before)
            entry = None
        if entry is not None and entry.last_ok and now - entry.last_at < REFRESH_S:
            return  # nothing to change but a success time under REFRESH_S old: skip the TTLCache re-set
        entry = entry or _Entry()
        entry.last_ok, entry.last_at, entry.streak = True, now, 0
        table[tenant_id] = entry  # re-set: refreshes its expiry

    def failed(self, replica_id: str, tenant_id: str | None, vouched: bool = False) -> TenantVerdict:
        """``tenant_id``'s request failed on ``replica_id`` (a gateway failure); returns the
        :class:`TenantVerdict`. Opens the pair (and calls ``on_open``) when this failure is attributed and
        the pair has ``threshold`` consecutive failures or ``threshold`` failures within ``window_s``
        (R9-2). ``vouched``: the gateway's own verification probe of the replica passed recently
        (gateway/replica_verify.py, S9-L4): no other tenant's failure corroborates this one, it is
        attributed. O(tenants tracked on the replica)."""
        if tenant_id is None:
            return TenantVerdict(False, 0, False, True)
        now = self._clock()
        table = self._table(replica_id)
        horizon = now - self.window_s
        served_seq = self._served_seq.get(replica_id, 0)  # a failure before it corroborates nothing
        others_served = corroborated = False
        for t, e in list(table.items()):
            if t == tenant_id or e.last_at < horizon:
                continue
            if e.last_ok:
                others_served = True
            elif e.seq > served_seq and not vouched:
                corroborated = True
        self._seq += 1
        entry = table.get(tenant_id) or _Entry()
        entry.last_ok, entry.last_at, entry.seq = False, now, self._seq
        entry.streak += 1
        attributed, opened = not corroborated, False
        times = entry.failures  # R9-2: the pair's attributed failures, whatever 2xx came between
        if attributed:
            times.append(now)
            if len(times) > self.threshold:
                del times[0]
        in_window = len(times) >= self.threshold and times[0] >= horizon
        if attributed and (entry.streak >= self.threshold or in_window) and entry.open_until <= now:
            entry.open_until, opened = now + self.cooldown_s, True
            self.open_until_max = max(self.open_until_max, entry.open_until)
            self.blocked_pairs += 1
        table[tenant_id] = entry
        if opened and self.on_open is not None:
            self.on_open(replica_id, tenant_id)
        return TenantVerdict(attributed, entry.streak, opened,
                             not (attributed and others_served and entry.streak >= 2))

    def blocked(self, replica_id: str, tenant_id: str | None) -> bool:
        """True while the (``replica_id``, ``tenant_id``) circuit is open (its cool-down not over)."""
        if tenant_id is None:
            return False
        table = self._replicas.get(replica_id)
        entry = table.get(tenant_id) if table is not None else None
        return entry is not None and entry.open_until > self._clock()

    def streak(self, replica_id: str, tenant_id: str | None) -> int:
        """The (``replica_id``, ``tenant_id``) pair's consecutive gateway failures (0 if unknown)."""
        table = self._replicas.get(replica_id)
        entry = table.get(tenant_id) if table is not None and tenant_id is not None else None
        return entry.streak if entry is not None else 0

    def any_open(self) -> bool:
        """True when some pair may still be open (O(1): the routing fast path asks it per request)."""
        return self.open_until_max > self._clock()

    def forget(self, replica_id: str) -> None:
        """Drop everything known about ``replica_id`` (removed, or restarted)."""
        self._replicas.pop(replica_id, None)
        self._served_seq.pop(replica_id, None)
