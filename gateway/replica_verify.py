"""The gateway's own check before tenant evidence opens a replica's shared circuit (session 10, S9-L4).

Review R8-2 made a gateway failure count against a replica's *shared* circuit (every tenant's
routing) only when it is **corroborated**: another tenant's recent gateway failure there with no 2xx
since (gateway/tenant_breaker.py). Two tenants one attacker controls (or one principal with
identities in two tenants) corroborate each other: each sends input that makes the replica answer
502/503/504, time out or drop the connection, and the replica leaves every tenant's rotation
(S9-L4). No rule over tenant-attributable failures separates k colluders from k honest tenants
meeting a real fault, so the gateway asks the replica itself: when such failures would *open* the
shared circuit, it sends one request of its own (gateway/health.py ``completion_probe``: a one-token
completion of a served model, under no tenant, bounded by a timeout) and the circuit opens only if
that fails too. If it passes, the replica serves: the failures stay with their tenants' per-(replica,
tenant) circuits, and for :attr:`VerifyGate.interval_s` after that pass every tenant failure there
is attributed to its tenant without another probe. The opening of one tenant's own pair asks the
same question (``ReplicaSet.pair_opened``): a real fault that ``/health`` misses and one tenant alone
meets then opens the shared circuit without waiting for a second tenant.

:class:`VerifyGate` is the bound on those probes, pure logic: at most **one in flight per replica**
and at least ``interval_s`` seconds from the end of one probe to the start of the next on one
replica, whatever the tenants do; within the interval the last probe's verdict stands (a pass: failures are the tenants'; a
failure: the circuit opens at once). Failures that need no verification open the circuit as before:
a connection that could not be made (nothing was sent), a failure with no tenant known, and a
replica set without a verifier (unit tests of the breaker alone).

The bound is per process (review R10b-6, accepted in session 11): ``serve --workers N`` sends at
most N probes per interval per replica. It is not shared through the state backend: a lease alone
would leave the workers that lose it without the probe's *verdict* (they would count the failure
as before S9-L4), and sharing the verdict needs an authenticated record, polling while the probe
runs and wiring through the upstream client, for N-1 fewer probes; docs/security.md, session 11.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["VerifyGate", "Gate", "MIN_INTERVAL_S"]

#: floor on the seconds between two verification probes of one replica
MIN_INTERVAL_S = 1.0


class Gate(enum.Enum):
    """What to do with a tenant-evidence failure that would open a replica's shared circuit."""

    START = "start"  # send a verification probe now (none in flight, the interval has passed)
    HOLD = "hold"  # a probe is in flight: its verdict decides
    PASSED = "passed"  # the last probe passed within the interval: the failure is the tenant's
    FAILED = "failed"  # the last probe failed within the interval: open the circuit


@dataclass(slots=True)
class _Probe:
    at: float  # when it started; once ended, when it ended
    in_flight: bool = True
    ok: bool = False


class VerifyGate:
    """Verification probes per replica: one in flight, ``interval_s`` (seconds, > 0) from a probe's end
    to the next one's start, the last verdict standing until then. ``clock``:
    monotonic seconds. Raises :class:`ValueError` for a non-positive interval."""

    def __init__(self, interval_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = interval_s
        self._clock = clock
        self._probes: dict[str, _Probe] = {}
        self.started = 0  # probes started (tests, notes)

    def decide(self, replica_id: str) -> Gate:
        """The :class:`Gate` for a failure on ``replica_id`` that would open its shared circuit."""
        p = self._probes.get(replica_id)
        if p is None:
            return Gate.START
        if p.in_flight:
            return Gate.HOLD
        if self._clock() - p.at < self.interval_s:
            return Gate.PASSED if p.ok else Gate.FAILED
        return Gate.START

    def began(self, replica_id: str) -> None:
        """A verification probe of ``replica_id`` was sent (call after :meth:`decide` said START)."""
        self._probes[replica_id] = _Probe(self._clock())
        self.started += 1

    def ended(self, replica_id: str, ok: bool) -> None:
        """The probe of ``replica_id`` ended: ``ok`` True when the replica served it. No effect when none
        is in flight (the replica was forgotten meanwhile)."""
        p = self._probes.get(replica_id)
        if p is not None and p.in_flight:
            p.in_flight, p.ok, p.at = False, ok, self._clock()

    def vouched(self, replica_id: str) -> bool:
        """True while the last probe of ``replica_id`` passed less than ``interval_s`` seconds ago: the
        replica served the gateway's own request, so tenant failures there are the tenants'."""
        p = self._probes.get(replica_id)
        return p is not None and p.ok and not p.in_flight and self._clock() - p.at < self.interval_s

    def in_flight(self, replica_id: str) -> bool:
        """True while a probe of ``replica_id`` has no verdict yet."""
        p = self._probes.get(replica_id)
        return p is not None and p.in_flight

    def forget(self, replica_id: str) -> None:
        """Drop what is known about ``replica_id`` (removed); a probe in flight then changes nothing."""
        self._probes.pop(replica_id, None)
