"""Per-replica load accounting in tokens and requests.

Load is charged the moment the router dispatches a request, not when the
replica reports it, so a burst of arrivals within one scrape interval still
spreads (the "in-flight" view used by Dynamo's KV router and SGLang's router).
Three quantities per replica:

* queued prefill tokens: the uncached prompt tokens the router predicted the
  replica must still prefill (released at the first byte of the answer);
* decode tokens: expected output tokens of requests in flight (released when
  the request finishes);
* running requests: requests dispatched and not finished, and among them
  the prefilling requests (no first byte yet).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from routing.types import ReplicaLoad

__all__ = ["LoadTracker", "LoadTicket", "InProcessLoadTracker", "Notified", "ReplicaLoad", "Ticket"]


@runtime_checkable
class LoadTicket(Protocol):
    """Handle of one dispatched request (see :class:`Ticket`)."""

    replica_id: str

    @property
    def active(self) -> bool:
        """True until :meth:`finish` has been called."""
        ...

    def first_byte(self) -> None:
        """Release the prefill part (idempotent)."""
        ...

    def finish(self) -> None:
        """Release everything still held (idempotent)."""
        ...


class Notified(Protocol):
    """What a :class:`Ticket` notifies after each release that gave load back."""

    def on_release(self) -> None:
        """A replica gained room."""
        ...


@runtime_checkable
class LoadTracker(Protocol):
    """In-flight load per replica, charged at dispatch time.

    State that several gateway instances will share: the in-process
    :class:`InProcessLoadTracker` is the default; a shared implementation is
    fed from outside and keeps these calls local and synchronous.
    """

    def dispatch(self, replica_id: str, prefill_tokens: int, decode_tokens: int, requests: int = 1,
                 tenant: str = "", calibrate: bool = True) -> LoadTicket:
        """Charge one request to ``replica_id``; returns its ticket. ``tenant`` (its configured id) and
        ``calibrate`` are for a calibrating tracker (:mod:`routing.calibration`); others ignore them."""
        ...

    def snapshot(self, replica_id: str) -> ReplicaLoad:
        """Current load of ``replica_id`` (all zero for an unknown replica)."""
        ...


class _Counters:
    __slots__ = ("prefill", "decode", "running", "prefilling", "snap")

    def __init__(self) -> None:
        self.prefill = 0
        self.decode = 0
        self.running = 0
        self.prefilling = 0
        self.snap: ReplicaLoad | None = None  # the last snapshot, until a counter changes (immutable: shared)


class Ticket:
    """Handle of one dispatched request. :meth:`first_byte` releases its
    prefill tokens, :meth:`finish` releases whatever is still held; both are
    idempotent, so call ``finish`` in a ``finally`` on success, error or
    cancellation.

    ``notify``: an object whose ``on_release()`` (read at each release) is called after each release
    that gave load back (a wrapper's notification without a wrapping ticket; issue 14, session 14).
    """

    __slots__ = ("replica_id", "prefill_tokens", "decode_tokens", "requests", "_tracker", "_prefill_held", "_held",
                 "notify")

    def __init__(self, tracker: InProcessLoadTracker, replica_id: str, prefill_tokens: int, decode_tokens: int,
                 requests: int = 1, notify: Notified | None = None) -> None:
        self.replica_id = replica_id
        self.prefill_tokens = prefill_tokens
        self.decode_tokens = decode_tokens
        self.requests = requests
        self._tracker = tracker
        self._prefill_held = True
        self._held = True
        self.notify = notify

    @property
    def active(self) -> bool:
        """True until :meth:`finish` has been called."""
        return self._held

    def first_byte(self) -> None:
        """Release the prefill part (the first byte of the upstream answer arrived: the replica finished prefill)."""
        if self._prefill_held and self._held:
            self._prefill_held = False
            self._tracker.release(self.replica_id, self.prefill_tokens, 0, 0, self.requests)
            if self.notify is not None:
                self.notify.on_release()

    def finish(self) -> None:
        """Release everything still held (decode tokens, the running request,
        and the prefill part if no first byte was seen)."""
        if not self._held:
            return
        held = self._prefill_held
        self._prefill_held = False
        self._held = False
        tracker = self._tracker
        tracker.release(self.replica_id, self.prefill_tokens if held else 0, self.decode_tokens,
                        self.requests, self.requests if held else 0)
        tracker.snapshot(self.replica_id)  # built now (the request's end), not by the next decision (session 15)
        if self.notify is not None:
            self.notify.on_release()


class InProcessLoadTracker:
    """In-flight load per replica in this process, charged at dispatch time
    (see module doc). Not thread-safe: use it from one event loop."""

    def __init__(self) -> None:
        self._c: dict[str, _Counters] = {}

    #: :meth:`dispatch` takes ``notify`` (a notifying wrapper passes itself, no ticket of its own)
    takes_notify = True

    def dispatch(self, replica_id: str, prefill_tokens: int, decode_tokens: int, requests: int = 1,
                 tenant: str = "", calibrate: bool = True, notify: Notified | None = None) -> Ticket:
        """Charge one request to ``replica_id``: ``prefill_tokens`` (predicted
        uncached prompt tokens), ``decode_tokens`` (expected output tokens) and
        ``requests`` running requests (the sequences of a batch, default 1);
        ``tenant``, ``calibrate`` are ignored; ``notify``: see :class:`Ticket`. Negative values raise
        :class:`ValueError`. Returns its :class:`Ticket`."""
        self.charge(replica_id, prefill_tokens, decode_tokens, requests)
        return Ticket(self, replica_id, prefill_tokens, decode_tokens, requests, notify)

    def charge(self, replica_id: str, prefill_tokens: int, decode_tokens: int, requests: int = 1) -> None:
        """The counters' part of :meth:`dispatch` (same arguments and errors), for a ticket class of
        the caller's (a subclass of :class:`Ticket` built with this tracker: :mod:`routing.calibration_tracker`)."""
        if prefill_tokens < 0 or decode_tokens < 0 or requests < 0:
            raise ValueError("token counts must be non-negative")
        c = self._c.get(replica_id)
        if c is None:
            c = self._c[replica_id] = _Counters()
        c.prefill += prefill_tokens
        c.decode += decode_tokens
        c.running += requests
        c.prefilling += requests
        c.snap = None

    def snapshot(self, replica_id: str) -> ReplicaLoad:
        """Current load of ``replica_id`` (all zero for an unknown replica). The same (immutable)
        object is returned until the replica's counters change (no rebuild per call)."""
        c = self._c.get(replica_id)
        if c is None:
            return ReplicaLoad(replica_id)
        snap = c.snap
        if snap is None:
            snap = c.snap = ReplicaLoad(replica_id, c.prefill, c.decode, c.running, c.prefilling)
        return snap

    def tokens(self, replica_id: str) -> int:
        """``snapshot(replica_id).tokens`` (queued prefill + decode tokens; 0 for an unknown replica)
        without building a snapshot (issue 14, session 15: the request record's load figure, read
        right after a dispatch changed the counters)."""
        c = self._c.get(replica_id)
        return 0 if c is None else c.prefill + c.decode

    def release(self, replica_id: str, prefill: int, decode: int, running: int, prefilling: int = 0) -> None:
        """Give back ``prefill``/``decode`` tokens, ``running`` requests and
        ``prefilling`` requests (first byte seen) of ``replica_id`` (floored
        at zero); called by :class:`Ticket`."""
        c = self._c.get(replica_id)
        if c is None:
            return
        # max(0, v) as ``v if v > 0 else 0`` (the same object; session 13: no builtin call per counter)
        v = c.prefill - prefill
        c.prefill = v if v > 0 else 0
        v = c.decode - decode
        c.decode = v if v > 0 else 0
        v = c.running - running
        c.running = v if v > 0 else 0
        v = c.prefilling - prefilling
        c.prefilling = v if v > 0 else 0
        c.snap = None
