"""The load tracker that wakes the flow-control dispatcher (issue 17, docs/fairness.md):
:class:`NotifyingLoadTracker` wraps the router's :class:`routing.load.LoadTracker` and calls back
whenever a ticket gives load back (a first byte releases the prefill tokens, the end the rest),
so queued requests are looked at again as soon as a replica gains room.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING

from routing.load import LoadTicket, LoadTracker, Notified
from routing.types import ReplicaLoad

if TYPE_CHECKING:
    from gateway.flow_share import TenantShares

__all__ = ["NotifyingLoadTracker"]


class _NotifyingTicket:
    """A load ticket that calls its tracker's ``on_release`` (read at each release: it is set after
    building) after each release of its inner ticket."""

    __slots__ = ("_inner", "_tracker", "replica_id")

    def __init__(self, inner: LoadTicket, tracker: Notified) -> None:
        self._inner = inner
        self._tracker = tracker  # session 13: no closure per ticket, one frame less per release
        self.replica_id = inner.replica_id

    @property
    def active(self) -> bool:
        return self._inner.active

    def first_byte(self) -> None:
        self._inner.first_byte()
        self._tracker.on_release()

    def finish(self) -> None:
        was = self._inner.active
        self._inner.finish()
        if was:
            self._tracker.on_release()


class NotifyingLoadTracker:
    """A :class:`routing.load.LoadTracker` that calls ``on_release`` (set after building) whenever
    a ticket gives load back, so the dispatcher runs when a replica gains room."""

    def __init__(self, inner: LoadTracker) -> None:
        self.inner = inner
        self.on_release: Callable[[], None] = lambda: None
        self.shares: TenantShares | None = None  # :meth:`count_shares`
        self.snapshot = inner.snapshot  # type: ignore[method-assign]  # the inner tracker's, no frame per call
        tokens = getattr(inner, "tokens", None)
        if tokens is not None:  # ``snapshot(rid).tokens`` without a snapshot (routing.load.InProcessLoadTracker)
            self.tokens = tokens
        self._fused = bool(getattr(inner, "takes_notify", False))
        if self._fused:  # :meth:`dispatch` without its own frame (issue 14, session 15): the same call
            self.dispatch = partial(inner.dispatch, notify=self)  # type: ignore[method-assign,attr-defined]

    def count_shares(self, shares: TenantShares) -> None:
        """From now on count each dispatch's prefill tokens per tenant and replica in ``shares``
        (gateway/flow_share.py: flow control's per-tenant share of a replica's prefill room)."""
        self.shares = shares
        self.__dict__.pop("dispatch", None)  # the method below, not the fused partial

    def dispatch(self, replica_id: str, prefill_tokens: int, decode_tokens: int, requests: int = 1,
                 tenant: str = "", calibrate: bool = True) -> LoadTicket:
        """Charge the inner tracker (``tenant``, ``calibrate``: see ``LoadTracker.dispatch``); the ticket
        notifies on release: the inner ticket itself, given this tracker as its ``notify``, when the
        inner tracker ``takes_notify`` (issue 14, session 14: no wrapping ticket), else a wrapper. With
        :meth:`count_shares`, a request with prefill tokens is counted against ``tenant`` on
        ``replica_id`` until its ticket's first release."""
        shares = self.shares
        notify: Notified = self
        if shares is not None and prefill_tokens > 0 and tenant:
            notify = shares.take(replica_id, tenant, prefill_tokens, self)
        if self._fused:
            return self.inner.dispatch(replica_id, prefill_tokens, decode_tokens, requests, tenant, calibrate,
                                       notify=notify)  # type: ignore[call-arg]
        inner = self.inner.dispatch(replica_id, prefill_tokens, decode_tokens, requests, tenant, calibrate)
        return _NotifyingTicket(inner, notify)

    def snapshot(self, replica_id: str) -> ReplicaLoad:
        """The inner tracker's snapshot."""
        return self.inner.snapshot(replica_id)
