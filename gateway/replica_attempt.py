"""One upstream attempt on one replica and its verdict (:class:`Attempt`), made by
:meth:`gateway.replicas.ReplicaSet.attempt`: the verdict goes to the replica's shared circuit and to
the per-(replica, tenant) attribution (gateway/tenant_breaker.py, review R7b-1)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.replicas import ReplicaSet

__all__ = ["Attempt", "UnknownReplicaError"]


class UnknownReplicaError(KeyError):
    """Raised for a replica id that is not in the set (re-exported by gateway.replicas)."""


class Attempt:
    """One upstream attempt on one replica, from dispatch to its verdict.

    Made by :meth:`ReplicaSet.attempt`. The first of :meth:`succeeded`,
    :meth:`failed` and :meth:`release` settles it; later calls do nothing, so
    the code that knows the verdict gives it and one ``finally`` (or the
    ``with`` block's exit) releases whatever ended without one. ``probe`` is
    True when this attempt is the replica's half-open probe. Verdicts on a
    replica removed meanwhile are dropped (never raise).
    """

    __slots__ = ("replica_id", "probe", "tenant_id", "retry", "_set", "_open")

    def __init__(self, replica_set: ReplicaSet, replica_id: str, probe: bool, tenant_id: str | None = None) -> None:
        self.replica_id = replica_id
        self.probe = probe
        self.tenant_id, self.retry = tenant_id, True  # whose request; False: do not retry elsewhere (R7b-1)
        self._set = replica_set
        self._open = True

    @property
    def settled(self) -> bool:
        """True once a verdict (or a release) was applied."""
        return not self._open

    def first_byte(self) -> None:
        """The replica's 200 answer began (its first body byte arrived). For the half-open probe this
        is the circuit's verdict (R7-2): the circuit closes now, not at the answer's end, so one long
        stream cannot hold the replica out of rotation for a whole generation. The attempt itself
        stays open: the answer's end still gives its verdict (a stream cut later counts one failure
        on the closed circuit). No effect on other attempts or once settled."""
        if self.probe and self._open:
            self.probe = False  # a later release must not free another request's probe
            self._apply(self._set.record_success)
            self._set.tenants.succeeded(self.replica_id, self.tenant_id)

    def succeeded(self, served: bool = True) -> None:
        """The replica gave a complete answer, or an answer that is not a gateway failure (a 4xx,
        a plain 500: :func:`counts_against_replica`): reset its failures, close the circuit.
        ``served``: a 2xx; False: no evidence for the tenant breaker that the replica serves (R8-4)."""
        if self._settle():
            self._apply(self._set.record_success)
            self._set.tenants.succeeded(self.replica_id, self.tenant_id, served)

    def failed(self, reached: bool = True) -> None:
        """A replica fault (502/503/504, timeout, connect error, reset or broken answer): count it
        (a failed probe re-opens the circuit) unless it is attributed to the request's tenant
        (gateway/tenant_breaker.py): then only the (replica, tenant) pair counts it and a probe is
        released. ``reached`` False (no connection: nothing sent) is never attributed (R8-2). A failure
        counted against the shared circuit on tenants' evidence goes through
        :meth:`ReplicaSet.corroborated_failure` (the gateway verifies before the circuit opens), and
        while the gateway's own verification probe of the replica stands as passed every tenant failure
        there is attributed (session 10, S9-L4); a failure that opens the tenant's own pair asks for a
        verification too (:meth:`ReplicaSet.pair_opened`)."""
        if self._settle():
            tenant = self.tenant_id if reached else None
            vouched = tenant is not None and self._set.vouched(self.replica_id)  # S9-L4: the gateway's probe passed
            verdict = self._set.tenants.failed(self.replica_id, tenant, vouched=vouched)
            self.retry = verdict.retry
            if not verdict.attributed:  # tenant evidence is verified by the gateway's own probe first (S9-L4)
                self._apply(self._set.record_failure if tenant is None else self._set.corroborated_failure)
            elif self.probe:
                self._apply(self._set.release_probe)
            if verdict.opened:  # one tenant's pair opened: is the replica failing for everyone? (session 10)
                self._apply(self._set.pair_opened)

    def release(self) -> None:
        """No verdict on the replica (client gone, cancelled, gateway error):
        if this attempt was the half-open probe, let the next request probe."""
        if self._settle() and self.probe:
            self._apply(self._set.release_probe)

    def _settle(self) -> bool:
        was_open, self._open = self._open, False
        return was_open

    def _apply(self, fn: Callable[[str], None]) -> None:
        try:
            fn(self.replica_id)
        except UnknownReplicaError:  # the replica was removed meanwhile
            pass

    def __enter__(self) -> Attempt:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
