"""Replica inventory with health state and a per-replica circuit breaker.

Health comes from two sources: the active checker (``health.HealthChecker``,
``GET /health``) marks replicas up or down; the proxy reports each upstream
outcome, and ``failure_threshold`` consecutive upstream failures open the
replica's circuit for ``cooldown_s`` seconds, after which one half-open probe
request is let through (success closes the circuit, failure re-opens it) —
the classic circuit-breaker state machine (Nygard, "Release It!").
Only *gateway failures* count against a replica, as Envoy's outlier detection
``consecutive_gateway_failure``: locally originated errors (connect error,
timeout, reset, a broken or unreadable answer) and the statuses in
:data:`GATEWAY_FAILURE_STATUSES` (502, 503, 504). Every other answer, a 4xx
and a plain 500 included, proves the replica alive and resets the count: a 500
is what an engine answers to one request it cannot process (a "query of
death"), so counting it let one tenant's input open every replica's circuit
for all tenants (review R7-2); it is not retried on another replica either
(:func:`retryable_status`). A replica is routable iff it is healthy and its
circuit allows a request.

Every upstream attempt is an :class:`Attempt` (``ReplicaSet.attempt``) that
takes exactly one verdict: ``succeeded``, ``failed`` or, when it ended with
no verdict on the replica (the client left, the task was cancelled, the
gateway failed), ``release`` — which is also what leaving it as a context
manager does, so no way an attempt ends can leave a half-open probe in
flight for good (see docs/routing.md, "Circuit breaker").

A failure that tenants' evidence alone would make open the circuit (corroborated by another
tenant's failure: gateway/tenant_breaker.py) opens it only once the gateway's own verification
probe failed too (:meth:`ReplicaSet.corroborated_failure`, gateway/replica_verify.py; session 10,
S9-L4: two colluding tenants opened it for everyone).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.replica_attempt import Attempt, UnknownReplicaError
from gateway.replica_verify import MIN_INTERVAL_S, Gate, VerifyGate
from gateway.tenant_breaker import DEFAULT_WINDOW_S, TenantBreaker
from routing.filters import HealthFilter, TenantPoolFilter

__all__ = ["Attempt", "Replica", "ReplicaSet", "ReplicaState", "CircuitState", "UnknownReplicaError",
           "GATEWAY_FAILURE_STATUSES", "counts_against_replica", "retryable_status"]

#: upstream statuses that count against the replica (Envoy's "gateway errors"); any other status does not
GATEWAY_FAILURE_STATUSES = frozenset({502, 503, 504})


def counts_against_replica(status: int) -> bool:
    """True when an upstream answer with HTTP ``status`` is a replica failure for its circuit
    breaker: 502, 503, 504 only (R7-2). A 500 and other 5xx are the request's failure."""
    return status in GATEWAY_FAILURE_STATUSES


def retryable_status(status: int) -> bool:
    """True when an upstream answer with HTTP ``status`` may be retried on another replica: the
    gateway failures and 429 (the replica shedding load). A 500 is not (R7-2: the same input fails
    the same way elsewhere, and each retry would cost another replica's engine)."""
    return status == 429 or status in GATEWAY_FAILURE_STATUSES


@dataclass(frozen=True)
class Replica:
    """One upstream replica: ``id``, base ``url`` (no trailing slash needed),
    ``pool`` name, free-form ``labels``, and ``cache_salt`` (whether the
    replica honours vLLM's per-request ``cache_salt`` field)."""

    id: str
    url: str
    pool: str = "default"
    labels: Mapping[str, str] = field(default_factory=dict)
    cache_salt: bool = True


class CircuitState(enum.Enum):
    """Circuit-breaker state of one replica."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass
class ReplicaState:
    """Mutable health state of one replica (owned by :class:`ReplicaSet`)."""

    healthy: bool = True
    consecutive_failures: int = 0
    circuit: CircuitState = CircuitState.CLOSED
    opened_at: float = 0.0
    probe_in_flight: bool = False
    instance_id: str | None = None
    #: clock time (the set's clock, seconds) of the last real upstream success; None before any
    last_success_at: float | None = None


class ReplicaSet:
    """Replicas by id with health and circuit state.

    ``failure_threshold``: consecutive upstream failures that open the
    circuit; ``cooldown_s``: seconds before an open circuit admits one
    half-open probe; ``clock``: monotonic seconds (injectable for tests);
    ``tenant_window_s``: the per-(replica, tenant) evidence window (gateway/tenant_breaker.py);
    ``verify_interval_s``: seconds between two verification probes of one replica (default
    max(``cooldown_s``, 1 s); gateway/replica_verify.py). :attr:`verifier` (None: no verification,
    tenant evidence opens the circuit as before) is set by the upstream edge: called with a replica
    id, it returns True once it has started a verification probe whose verdict it will give to
    :meth:`verified`, False when it cannot send one.
    Replicas start healthy (the checker marks them down if they are not).
    Raises :class:`ValueError` on duplicate ids or bad thresholds.

    :attr:`version` (int) goes up on every change that can change which replicas are
    routable: membership, health verdicts, circuit transitions, half-open probes. The
    routable set and the candidates per pool set are kept until it moves (issue 14: they are
    asked for on every request), and not kept at all while any circuit is open (its
    cool-down turns it half-open with time). The :class:`ReplicaState` objects are this
    set's: change them through its methods, not by assignment.
    """

    #: bound on cached candidate lists (one per distinct tenant pool set)
    CANDIDATES_CACHE_MAX = 256

    def __init__(
        self,
        replicas: Iterable[Replica],
        *,
        failure_threshold: int = 5,
        cooldown_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
        tenant_window_s: float = DEFAULT_WINDOW_S,
        verify_interval_s: float | None = None,
    ) -> None:
        if failure_threshold < 1 or cooldown_s < 0:
            raise ValueError("failure_threshold must be >= 1 and cooldown_s >= 0")
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self.tenants = TenantBreaker(failure_threshold, cooldown_s, window_s=tenant_window_s, clock=clock)  # R8-2
        interval = max(cooldown_s, MIN_INTERVAL_S) if verify_interval_s is None else verify_interval_s
        self.verify = VerifyGate(interval, clock)  # S9-L4
        self.verifier: Callable[[str], bool] | None = None
        self._replicas: dict[str, Replica] = {}
        self._state: dict[str, ReplicaState] = {}
        self.version = 0
        self._routable: tuple[str, ...] | None = None  # routable ids at _routable_version
        self._routable_version = -1
        self._candidates: dict[Any, tuple[Replica, ...]] = {}  # pools -> candidates at _routable_version
        self._routable_frozen: frozenset[str] = frozenset()  # set(_routable) (issue 14, session 15)
        for r in replicas:
            self.add(r)

    def add(self, replica: Replica) -> None:
        """Add ``replica`` (healthy, circuit closed); duplicate id raises :class:`ValueError`."""
        if replica.id in self._replicas:
            raise ValueError(f"duplicate replica id {replica.id!r}")
        self._replicas[replica.id] = replica
        self._state[replica.id] = ReplicaState()
        self.version += 1

    def remove(self, replica_id: str) -> None:
        """Remove a replica (no error if absent)."""
        self._replicas.pop(replica_id, None)
        self._state.pop(replica_id, None)
        self.tenants.forget(replica_id)
        self.verify.forget(replica_id)
        self.version += 1

    def get(self, replica_id: str) -> Replica:
        """The replica called ``replica_id``; raises :class:`UnknownReplicaError`."""
        try:
            return self._replicas[replica_id]
        except KeyError:
            raise UnknownReplicaError(replica_id) from None

    def state(self, replica_id: str) -> ReplicaState:
        """Health state of ``replica_id`` (circuit advanced to half-open if
        its cool-down has passed); raises :class:`UnknownReplicaError`."""
        try:
            st = self._state[replica_id]
        except KeyError:
            raise UnknownReplicaError(replica_id) from None
        if st.circuit is CircuitState.OPEN and self._clock() - st.opened_at >= self.cooldown_s:
            st.circuit = CircuitState.HALF_OPEN
            st.probe_in_flight = False
            self.version += 1
        return st

    def all(self) -> list[Replica]:
        """All replicas, in insertion order."""
        return list(self._replicas.values())

    def is_routable(self, replica_id: str) -> bool:
        """Healthy, and the circuit is closed or half-open with no probe in flight."""
        st = self.state(replica_id)
        if not st.healthy:
            return False
        if st.circuit is CircuitState.CLOSED:
            return True
        return st.circuit is CircuitState.HALF_OPEN and not st.probe_in_flight

    def routable_ids(self, pools: Iterable[str] | None = None) -> list[str]:
        """Ids of routable replicas (a new list, insertion order), optionally only those in ``pools``."""
        ids = self._routable_now()
        if pools is None:
            return list(ids)
        allowed = set(pools)
        return [rid for rid in ids if self._replicas[rid].pool in allowed]

    def routable_set(self) -> frozenset[str]:
        """``set(routable_ids())``, immutable; the same object while the routable ids are kept."""
        ids = self._routable_now()
        return self._routable_frozen if ids is self._routable else frozenset(ids)

    def _routable_now(self) -> tuple[str, ...]:
        """The routable ids, from the cache while :attr:`version` has not moved."""
        if self._routable_version == self.version and self._routable is not None:
            return self._routable
        self._candidates.clear()
        ids = tuple(rid for rid in list(self._replicas) if self.is_routable(rid))  # may advance circuits
        if any(st.circuit is CircuitState.OPEN for st in self._state.values()):
            self._routable = None  # time-dependent (cool-down): not kept
        else:
            self._routable, self._routable_version, self._routable_frozen = ids, self.version, frozenset(ids)
        return ids

    def candidates(self, pools: Iterable[str], tenant_id: str | None = None) -> list[Replica]:
        """Replicas routable now (healthy, breaker closed) in ``pools`` (all pools when empty),
        a new list in insertion order; without those whose circuit for ``tenant_id`` is open (R7b-1).

        Only these go to the policy decision point: a policy can narrow them,
        never widen them (defence in depth against a policy omitting both lists).
        """
        ids = self._routable_now()
        cacheable = self._routable is not None and isinstance(pools, (frozenset, tuple))
        if cacheable and (hit := self._candidates.get(pools)) is not None:
            out = list(hit)
        else:
            out = HealthFilter(ids).filter(TenantPoolFilter(pools).filter(self.all()))
            if cacheable:
                if len(self._candidates) >= self.CANDIDATES_CACHE_MAX:
                    self._candidates.clear()
                self._candidates[pools] = tuple(out)
        if tenant_id is not None and self.tenants.any_open():
            out = [r for r in out if not self.tenants.blocked(r.id, tenant_id)]
        return out

    def on_dispatch(self, replica_id: str) -> bool:
        """Call when a request is sent to ``replica_id``: in half-open state
        it becomes the single probe (others are held back until it resolves).
        Returns True when it became the probe. Prefer :meth:`attempt`, which
        also guarantees the probe is settled."""
        st = self.state(replica_id)
        if st.circuit is CircuitState.HALF_OPEN:
            st.probe_in_flight = True
            self.version += 1
            return True
        return False

    def attempt(self, replica_id: str, tenant_id: str | None = None) -> Attempt:
        """Dispatch one upstream attempt of ``tenant_id``'s request to ``replica_id`` (:meth:`on_dispatch`)
        and return its :class:`Attempt`, which must be settled however the
        attempt ends (use it as a context manager, or call
        :meth:`Attempt.release` in a ``finally``). Raises
        :class:`UnknownReplicaError`."""
        return Attempt(self, replica_id, self.on_dispatch(replica_id), tenant_id)

    def release_probe(self, replica_id: str) -> None:
        """The request chosen as the half-open probe ended without a verdict
        (its client went away before the replica answered): let the next
        request probe. No effect in other states."""
        st = self.state(replica_id)
        if st.circuit is CircuitState.HALF_OPEN:
            st.probe_in_flight = False
            self.version += 1

    def record_success(self, replica_id: str) -> None:
        """An upstream exchange succeeded: reset failures, close the circuit."""
        st = self.state(replica_id)
        if st.circuit is not CircuitState.CLOSED or st.probe_in_flight:
            st.circuit = CircuitState.CLOSED
            st.probe_in_flight = False
            self.version += 1
        st.consecutive_failures = 0
        st.last_success_at = self._clock()

    def answered_recently(self, replica_id: str, within_s: float) -> bool:
        """Passive health: True when the replica's last real upstream verdict was a success
        (no failure since) at most ``within_s`` seconds ago. Raises :class:`UnknownReplicaError`."""
        st = self.state(replica_id)
        return (st.consecutive_failures == 0 and st.last_success_at is not None
                and self._clock() - st.last_success_at <= within_s)

    def record_failure(self, replica_id: str) -> None:
        """An upstream failure (connect error, timeout, 502/503/504, broken stream):
        a failed half-open probe re-opens the circuit; ``failure_threshold``
        consecutive failures open it."""
        st = self.state(replica_id)
        st.consecutive_failures += 1
        if st.circuit is CircuitState.HALF_OPEN or st.consecutive_failures >= self.failure_threshold:
            st.circuit = CircuitState.OPEN
            st.opened_at = self._clock()
            st.probe_in_flight = False
            self.version += 1

    def vouched(self, replica_id: str) -> bool:
        """True while the gateway's own verification probe of ``replica_id`` passed within the
        verification interval (then tenant failures there are attributed to their tenants, S9-L4)."""
        return self.verifier is not None and self.verify.vouched(replica_id)

    def corroborated_failure(self, replica_id: str) -> None:
        """A gateway failure that tenants' evidence counts against the replica (corroborated by another
        tenant's failure, gateway/tenant_breaker.py). Counted like :meth:`record_failure`, but when it
        would open the circuit (the count reaches ``failure_threshold``, or it is the half-open probe)
        the gateway verifies first (S9-L4): a verification probe is started (at most one in flight,
        ``verify_interval_s`` apart: :class:`gateway.replica_verify.VerifyGate`) and the circuit stays
        as it is until :meth:`verified` (a half-open circuit keeps its probe slot, so nothing else is
        sent meanwhile); a probe that failed within the interval opens it at once; one that passed
        leaves the failure to its tenant. Without a :attr:`verifier`, or when none can be sent:
        :meth:`record_failure`. Raises :class:`UnknownReplicaError`."""
        st = self.state(replica_id)
        opens = st.circuit is CircuitState.HALF_OPEN or st.consecutive_failures + 1 >= self.failure_threshold
        if self.verifier is None or st.circuit is CircuitState.OPEN or not opens:
            self.record_failure(replica_id)
            return
        gate = self.verify.decide(replica_id)
        if gate is Gate.FAILED or (gate is Gate.START and not self._start_verify(replica_id)):
            self.record_failure(replica_id)
        elif gate is not Gate.PASSED:  # START (sent) or HOLD: the probe's verdict decides
            st.consecutive_failures += 1

    def pair_opened(self, replica_id: str) -> None:
        """One tenant's own failures opened its (replica, tenant) circuit on ``replica_id``: when the
        shared circuit is closed and the verification gate allows one, start a verification probe, so
        that a real fault that ``/health`` misses and only one tenant meets opens the shared circuit
        (if the gateway's own request fails there too, :meth:`verified`) instead of waiting for a
        second tenant (session 10). No effect without a verifier, during a verification's interval, or
        when none can be sent. Raises :class:`UnknownReplicaError`."""
        if (self.verifier is not None and self.state(replica_id).circuit is CircuitState.CLOSED
                and self.verify.decide(replica_id) is Gate.START):
            self._start_verify(replica_id)

    def _start_verify(self, replica_id: str) -> bool:
        assert self.verifier is not None
        self.verify.began(replica_id)
        if self.verifier(replica_id):
            return True
        self.verify.ended(replica_id, False)
        return False

    def verified(self, replica_id: str, ok: bool) -> None:
        """The verification probe of ``replica_id`` ended: ``ok`` (the replica served the gateway's own
        request) resets its failure count, closes a half-open circuit held for it and counts as a 2xx
        for the tenant table (tenants' earlier failures no longer corroborate each other); a failure
        opens the circuit (unless already open). No effect for an unknown replica."""
        self.verify.ended(replica_id, ok)
        st = self._state.get(replica_id)
        if st is None:
            return
        if ok:
            self.tenants.succeeded(replica_id, None)
            if st.circuit is not CircuitState.OPEN:
                self.record_success(replica_id)
        elif st.circuit is not CircuitState.OPEN:
            st.circuit, st.opened_at, st.probe_in_flight = CircuitState.OPEN, self._clock(), False
            self.version += 1

    def record_status(self, replica_id: str, status: int) -> None:
        """Classify an upstream HTTP status: 502, 503, 504 are replica failures
        (:func:`counts_against_replica`); any other status (client-caused 4xx,
        a plain 500) shows the replica alive."""
        if counts_against_replica(status):
            self.record_failure(replica_id)
        else:
            self.record_success(replica_id)

    def mark_health(self, replica_id: str, healthy: bool) -> None:
        """Set the health-check verdict for ``replica_id``."""
        st = self.state(replica_id)
        if st.healthy != healthy:
            self.version += 1
        st.healthy = healthy

    def observe_instance(self, replica_id: str, instance_id: str) -> bool:
        """Record the replica's reported ``instance_id``; returns True when it
        differs from a previously seen one (the replica restarted and lost its
        KV cache). A restart also resets the circuit."""
        st = self.state(replica_id)
        previous = st.instance_id
        st.instance_id = instance_id
        if previous is not None and previous != instance_id:
            st.consecutive_failures = 0
            st.circuit = CircuitState.CLOSED
            st.probe_in_flight = False
            self.version += 1
            return True
        return False
