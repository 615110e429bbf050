"""The load tracker wrapper that times first bytes for :mod:`routing.calibration` (split from it in
session 11; ``routing.calibration`` re-exports :class:`CalibratingLoadTracker`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from routing.load import InProcessLoadTracker, LoadTicket, Notified, Ticket
from routing.types import ReplicaLoad

if TYPE_CHECKING:
    from routing.calibration import Calibration

__all__ = ["CalibratingLoadTracker", "LATE_FIRST_BYTE"]


class _CalibratingTicket:
    """A load ticket that reports its first byte to a :class:`Calibration`."""

    __slots__ = ("_cal", "_clock", "_inner", "_queued", "_shared", "_t0", "_tenant", "_uncached", "replica_id")

    def __init__(self, inner: object, cal: Calibration, clock: Callable[[], float], queued: int,
                 uncached: int, replica_id: str, shared: int, tenant: str) -> None:
        self._inner = inner
        self._cal = cal
        self._clock = clock
        self._t0: float | None = clock()
        self._queued = queued
        self._shared = shared
        self._uncached = uncached
        self._tenant = tenant
        self.replica_id = replica_id

    @property
    def active(self) -> bool:
        """True until :meth:`finish` has been called."""
        return self._inner.active  # type: ignore[attr-defined,no-any-return]

    def first_byte(self) -> None:
        """Feed the observation once, then release the prefill part."""
        if self._t0 is not None and self._inner.active:  # type: ignore[attr-defined]
            self._cal.observe_first_byte(self.replica_id, self._uncached, self._queued, self._clock() - self._t0,
                                         self._shared, self._tenant)
        self._t0 = None
        self._inner.first_byte()  # type: ignore[attr-defined]

    def observe_first_byte_at(self, t: float) -> None:
        """Feed the observation of a first byte that arrived at ``t`` (a reading of the tracker's clock,
        seconds), once and only while no first byte was observed and the ticket is active; release
        nothing (the caller finishes the ticket next: :meth:`finish` releases the prefill part with the
        rest). Session 16, A15-2: a plain answer's first byte comes with its end; the gateway observes it
        after the answer's last part with the time the byte arrived (the same figure)."""
        if self._t0 is not None and self._inner.active:  # type: ignore[attr-defined]
            self._cal.observe_first_byte(self.replica_id, self._uncached, self._queued, t - self._t0,
                                         self._shared, self._tenant)
        self._t0 = None

    def finish(self) -> None:
        """Release everything still held (no observation without a first byte)."""
        self._t0 = None
        self._inner.finish()  # type: ignore[attr-defined]


class _FusedCalibratingTicket(Ticket):
    """One ticket for the calibrating tracker over an :class:`InProcessLoadTracker` (issue 14,
    session 14: no wrapping ticket, one frame per release instead of three): :class:`Ticket`'s
    releases and ``notify``, and at the first byte (while the ticket holds its prefill part)
    the observation :class:`_CalibratingTicket` feeds."""

    __slots__ = ("_cal", "_clock", "_queued", "_shared", "_t0", "_tenant")

    def __init__(self, tracker: InProcessLoadTracker, replica_id: str, prefill_tokens: int, decode_tokens: int,
                 requests: int, notify: Notified | None, cal: Calibration,
                 clock: Callable[[], float], queued: int, shared: int, tenant: str) -> None:
        super().__init__(tracker, replica_id, prefill_tokens, decode_tokens, requests, notify)
        self._cal = cal
        self._clock = clock
        self._queued = queued
        self._shared = shared
        self._tenant = tenant
        self._t0: float | None = clock()  # None: its first byte was observed

    def first_byte(self) -> None:
        """Feed the observation once (the ticket still holds its prefill part and no first byte was
        observed), then release that part."""
        if self._prefill_held and self._held:
            t0 = self._t0
            if t0 is not None:
                self._cal.observe_first_byte(self.replica_id, self.prefill_tokens, self._queued,
                                             self._clock() - t0, self._shared, self._tenant)
            super().first_byte()  # Ticket's release of the prefill part and its notify

    def observe_first_byte_at(self, t: float) -> None:
        """:meth:`_CalibratingTicket.observe_first_byte_at`: the observation of a first byte at ``t`` (the
        tracker's clock), once, while the ticket holds its prefill part; nothing released (the caller's
        :meth:`finish` next releases it all in one step: one release and one notify, not two)."""
        t0 = self._t0
        if t0 is not None and self._prefill_held and self._held:
            self._t0 = None
            self._cal.observe_first_byte(self.replica_id, self.prefill_tokens, self._queued, t - t0,
                                         self._shared, self._tenant)


#: the ticket types whose first byte can be observed later, with the time it arrived
#: (:meth:`_CalibratingTicket.observe_first_byte_at`; session 16, A15-2)
LATE_FIRST_BYTE: frozenset[type] = frozenset((_CalibratingTicket, _FusedCalibratingTicket))


class CalibratingLoadTracker:
    """A :class:`routing.load.LoadTracker` wrapper that times each ticket from
    dispatch to ``first_byte()`` with ``clock`` (seconds; ``time.monotonic``
    in the gateway, simulated time in ``sim/des.py``) and feeds ``calibration``
    with (uncached = the ticket's prefill tokens, queued = the replica's
    queued prefill tokens before this dispatch, shared wait =
    :meth:`routing.types.ReplicaLoad.shared_wait_tokens` before it, elapsed,
    the ticket's tenant)."""

    def __init__(self, inner: object, calibration: Calibration, clock: Callable[[], float]) -> None:
        self.inner = inner
        self.calibration = calibration
        self.clock = clock
        if calibration.clock is None:  # the fits' staleness in this clock's seconds (review R11b-2)
            calibration.clock = clock
        self.snapshot = inner.snapshot  # type: ignore[attr-defined,method-assign]  # no frame per call
        tokens = getattr(inner, "tokens", None)
        if tokens is not None:  # the inner tracker's load figure without a snapshot (routing.load)
            self.tokens = tokens
        #: over an in-process tracker: one fused ticket per dispatch, which takes ``notify``
        self._fused = type(inner) is InProcessLoadTracker
        #: :meth:`dispatch` takes ``notify``: fused, or passed on to an inner tracker that takes it (the
        #: shared one, routing/shared.py: session 17, so the flow-control tracker wraps no ticket and a
        #: plain answer's first byte is observed late there too, A15-2)
        self.takes_notify = self._fused or bool(getattr(inner, "takes_notify", False))

    def dispatch(self, replica_id: str, prefill_tokens: int, decode_tokens: int,
                 requests: int = 1, tenant: str = "", calibrate: bool = True,
                 notify: Notified | None = None) -> LoadTicket:
        """See :meth:`routing.load.LoadTracker.dispatch`; ``tenant`` (its configured id) is the fit
        the first byte feeds; ``calibrate`` False: it feeds none (the request has parts the router's
        token count does not predict: R10-3), the inner ticket is returned as is. ``notify``
        (only when :attr:`takes_notify`, else :class:`TypeError`): see :class:`routing.load.Ticket`;
        passed on to the inner tracker when not fused."""
        if self._fused:
            inner: InProcessLoadTracker = self.inner  # type: ignore[assignment]
            if not calibrate:
                return inner.dispatch(replica_id, prefill_tokens, decode_tokens, requests, notify=notify)
            before = inner.snapshot(replica_id)
            inner.charge(replica_id, prefill_tokens, decode_tokens, requests)  # raises on negatives
            queued = before.queued_prefill_tokens  # ReplicaLoad.shared_wait_tokens, inline (prefill >= 0 here)
            shared = before.prefilling_requests * prefill_tokens
            return _FusedCalibratingTicket(inner, replica_id, prefill_tokens, decode_tokens, requests, notify,
                                           self.calibration, self.clock, queued,
                                           queued if queued < shared else shared, tenant)
        if notify is not None and not self.takes_notify:
            raise TypeError("notify needs an inner tracker that takes it (takes_notify)")
        kw = {} if notify is None else {"notify": notify}
        if not calibrate:
            plain = self.inner.dispatch(replica_id, prefill_tokens, decode_tokens, requests, **kw)  # type: ignore
            return plain  # type: ignore[no-any-return]
        before: ReplicaLoad = self.inner.snapshot(replica_id)  # type: ignore[attr-defined]
        t = self.inner.dispatch(replica_id, prefill_tokens, decode_tokens, requests, **kw)  # type: ignore[attr-defined]
        return _CalibratingTicket(t, self.calibration, self.clock, before.queued_prefill_tokens, prefill_tokens,
                                  replica_id, before.shared_wait_tokens(prefill_tokens), tenant)

    def snapshot(self, replica_id: str) -> ReplicaLoad:
        """See :meth:`routing.load.LoadTracker.snapshot`."""
        return self.inner.snapshot(replica_id)  # type: ignore[attr-defined,no-any-return]
