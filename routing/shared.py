"""Routing state shared by several gateway instances: pure views and event application (issue 16).

Each instance routes on its own synchronous :class:`routing.index.PrefixIndex`
and :class:`routing.load.LoadTracker`; with a shared backend it also tells
the others what it dispatched and applies what they dispatched. This module
holds only the pure part: event values, the wrappers that *emit* events
through a plain callback when the router records or charges something, and
the functions that *apply* other instances' events. The transport (a Redis
Stream) lives outside ``routing`` (gateway/shared_routing.py); nothing here
performs I/O or reads a clock.

Events (``replica_id`` is the gateway's replica id; block keys are the
tenant-keyed HMAC outputs of :func:`tenancy.prefix.block_hash_chain`, never
tokens or text):

* :class:`BlocksRecorded` — a request's current-version chain sent to a replica;
* :class:`LoadDelta` — a change of one instance's load on a replica (positive at
  dispatch, negative at first byte and at the end);
* :class:`LoadSnapshot` — one instance's whole load per replica (absolute;
  replaces what was known of it, so lost deltas heal at the next snapshot).

Load of other instances is kept per instance (:class:`RemoteLoadView`), so
an instance that stops renewing its lease is dropped as a whole
(:meth:`RemoteLoadView.retain`) and leaves no phantom load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from routing.index import IndexStats, PrefixIndex
from routing.load import LoadTicket, LoadTracker, Notified
from routing.types import ReplicaLoad

__all__ = [
    "BlocksRecorded",
    "LoadDelta",
    "LoadSnapshot",
    "PublishingPrefixIndex",
    "RemoteLoadView",
    "RoutingEvent",
    "SharedLoadTracker",
    "apply_event",
]


@dataclass(frozen=True, slots=True)
class BlocksRecorded:
    """``keys`` (one request's chain, HMAC outputs) were sent to ``replica_id``."""

    replica_id: str
    keys: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class LoadDelta:
    """A change of the sender's load on ``replica_id``: prefill and decode tokens, running requests."""

    replica_id: str
    prefill_tokens: int
    decode_tokens: int
    running_requests: int


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """The sender's whole load: replica id -> (prefill tokens, decode tokens, running requests)."""

    loads: Mapping[str, tuple[int, int, int]]


RoutingEvent = BlocksRecorded | LoadDelta | LoadSnapshot
Emit = Callable[[RoutingEvent], None]


class RemoteLoadView:
    """Other instances' load per replica, kept per instance (in tokens and requests).

    Not thread-safe: use it from one event loop. Values are floored at zero
    (a delta whose dispatch was trimmed from the stream cannot go negative).
    """

    def __init__(self) -> None:
        self._by_instance: dict[str, dict[str, list[int]]] = {}
        self._total: dict[str, list[int]] = {}

    def instances(self) -> set[str]:
        """Ids of the instances whose load is held."""
        return set(self._by_instance)

    def apply_delta(self, instance_id: str, delta: LoadDelta) -> None:
        """Add ``delta`` to ``instance_id``'s load on its replica (in place: no lists per event)."""
        rid = delta.replica_id
        per = self._by_instance.get(instance_id)
        if per is None:
            per = self._by_instance[instance_id] = {}
        cur = per.get(rid)
        if cur is None:
            cur = per[rid] = [0, 0, 0]
        t = self._total.get(rid)
        if t is None:
            t = self._total[rid] = [0, 0, 0]
        for i, d in ((0, delta.prefill_tokens), (1, delta.decode_tokens), (2, delta.running_requests)):
            v = cur[i] + d
            if v < 0:
                v = 0
            t[i] += v - cur[i]
            cur[i] = v

    def apply_snapshot(self, instance_id: str, snap: LoadSnapshot) -> None:
        """Replace everything held of ``instance_id`` by ``snap``."""
        self.drop(instance_id)
        per = self._by_instance.setdefault(instance_id, {})
        for rid, (p, d, r) in snap.loads.items():
            new = [max(0, int(p)), max(0, int(d)), max(0, int(r))]
            self._shift(rid, [0, 0, 0], new)
            per[rid] = new

    def drop(self, instance_id: str) -> None:
        """Forget ``instance_id``'s load (it stopped renewing its lease)."""
        per = self._by_instance.pop(instance_id, None)
        for rid, cur in (per or {}).items():
            self._shift(rid, cur, [0, 0, 0])

    def retain(self, alive: Iterable[str]) -> set[str]:
        """Drop every instance not in ``alive``; returns the dropped ids."""
        keep = set(alive)
        gone = {i for i in self._by_instance if i not in keep}
        for i in gone:
            self.drop(i)
        return gone

    def total(self, replica_id: str) -> tuple[int, int, int]:
        """Summed (prefill tokens, decode tokens, running requests) of every other instance."""
        t = self._total.get(replica_id)
        return (t[0], t[1], t[2]) if t else (0, 0, 0)

    def _shift(self, rid: str, old: Sequence[int], new: Sequence[int]) -> None:
        t = self._total.setdefault(rid, [0, 0, 0])
        for i in range(3):
            t[i] += new[i] - old[i]


class _SharedTicket:
    """A local ticket that also emits the negative deltas of what it releases, and calls ``notify``'s
    ``on_release()`` after each release that gave load back (:class:`routing.load.Ticket`'s rule;
    session 17: no wrapping ticket of the flow-control tracker, so a calibrating ticket over this one
    is the ticket the pipeline holds and takes a plain answer's late first byte, A15-2)."""

    __slots__ = ("_decode", "_emit", "_inner", "_notify", "_prefill", "_prefill_out", "_running", "replica_id")

    def __init__(self, inner: LoadTicket, emit: Emit, prefill: int, decode: int, running: int,
                 notify: Notified | None = None) -> None:
        self.replica_id = inner.replica_id
        self._inner, self._emit, self._notify = inner, emit, notify
        self._prefill, self._decode, self._running = prefill, decode, running
        self._prefill_out = False

    @property
    def active(self) -> bool:
        return self._inner.active

    def first_byte(self) -> None:
        if self._inner.active and not self._prefill_out:
            self._prefill_out = True
            self._inner.first_byte()
            if self._prefill:
                self._emit(LoadDelta(self.replica_id, -self._prefill, 0, 0))
            if self._notify is not None:
                self._notify.on_release()

    def finish(self) -> None:
        if not self._inner.active:
            return
        prefill = 0 if self._prefill_out else self._prefill
        self._prefill_out = True
        self._inner.finish()
        self._emit(LoadDelta(self.replica_id, -prefill, -self._decode, -self._running))
        if self._notify is not None:
            self._notify.on_release()


class SharedLoadTracker:
    """A :class:`LoadTracker` whose snapshot is this instance's load plus the others'.

    ``local``: this instance's tracker (charged by :meth:`dispatch`);
    ``remote``: the others' load (fed by :func:`apply_event`); ``emit``:
    called synchronously with each :class:`LoadDelta` of this instance
    (dispatch, first byte, end), e.g. to queue it for publication.
    """

    def __init__(self, local: LoadTracker, remote: RemoteLoadView, emit: Emit) -> None:
        self.local = local
        self.remote = remote
        self._emit = emit

    #: :meth:`dispatch` takes ``notify`` (a notifying or calibrating wrapper passes it: no ticket of its own)
    takes_notify = True

    def dispatch(self, replica_id: str, prefill_tokens: int, decode_tokens: int, requests: int = 1,
                 tenant: str = "", calibrate: bool = True, notify: Notified | None = None) -> LoadTicket:
        """Charge locally (as ``local.dispatch``, same errors, ``tenant``/``calibrate`` passed on) and
        emit the positive delta. ``notify``: called after each release of the returned ticket that
        gave load back, after its delta is emitted (:class:`routing.load.Ticket`'s ``notify``)."""
        ticket = self.local.dispatch(replica_id, prefill_tokens, decode_tokens, requests, tenant, calibrate)
        self._emit(LoadDelta(replica_id, prefill_tokens, decode_tokens, requests))
        return _SharedTicket(ticket, self._emit, prefill_tokens, decode_tokens, requests, notify)

    def snapshot(self, replica_id: str) -> ReplicaLoad:
        """Local load plus every other live instance's load on ``replica_id``.

        ``prefilling_requests``: this instance's, plus, while the others hold prefill
        tokens there, their running requests (the events carry no prefilling count; all of
        them may still be prefilling, so ``shared_wait_tokens`` stays an upper bound)."""
        mine = self.local.snapshot(replica_id)
        p, d, r = self.remote.total(replica_id)
        if not (p or d or r):
            return mine
        return ReplicaLoad(replica_id, mine.queued_prefill_tokens + p, mine.decode_tokens + d,
                           mine.running_requests + r, mine.prefilling_requests + (r if p else 0))

    def local_snapshot(self, replica_ids: Iterable[str]) -> LoadSnapshot:
        """This instance's own load on ``replica_ids`` (what it publishes as its lease heartbeat)."""
        out = {}
        for rid in replica_ids:
            s = self.local.snapshot(rid)
            out[rid] = (s.queued_prefill_tokens, s.decode_tokens, s.running_requests)
        return LoadSnapshot(out)


class PublishingPrefixIndex:
    """A :class:`PrefixIndex` that emits a :class:`BlocksRecorded` for every local :meth:`record`.

    Every read is the ``inner`` index's; :func:`apply_event` records other
    instances' chains into ``inner`` without emitting them again.
    """

    def __init__(self, inner: PrefixIndex, emit: Emit) -> None:
        self.inner = inner
        self._emit = emit

    @property
    def capacity_blocks(self) -> int:
        """Per-replica capacity, in KV blocks."""
        return self.inner.capacity_blocks

    def match(self, replica_id: str, keys: Sequence[bytes]) -> int:
        """As :meth:`PrefixIndex.match`."""
        return self.inner.match(replica_id, keys)

    def match_many(self, keys: Sequence[bytes], replica_ids: Iterable[str]) -> dict[str, int]:
        """As :meth:`PrefixIndex.match_many`."""
        return self.inner.match_many(keys, replica_ids)

    def record(self, replica_id: str, keys: Sequence[bytes]) -> None:
        """Record locally, then emit the chain (nothing for an empty chain)."""
        self.inner.record(replica_id, keys)
        if keys:
            self._emit(BlocksRecorded(replica_id, tuple(keys[: self.inner.capacity_blocks])))

    def forget_replica(self, replica_id: str) -> None:
        """As :meth:`PrefixIndex.forget_replica` (local: every instance sees a replica restart itself)."""
        self.inner.forget_replica(replica_id)

    def replica_blocks(self, replica_id: str) -> int:
        """As :meth:`PrefixIndex.replica_blocks`."""
        return self.inner.replica_blocks(replica_id)

    def stats(self) -> IndexStats:
        """As :meth:`PrefixIndex.stats`."""
        return self.inner.stats()


def apply_event(index: PrefixIndex, remote: RemoteLoadView, instance_id: str, event: RoutingEvent) -> None:
    """Apply another instance's ``event`` to this instance's ``index`` (the inner, non-emitting one)
    and ``remote`` load view. Raises ``TypeError`` for an unknown event type."""
    if isinstance(event, BlocksRecorded):
        index.record(event.replica_id, event.keys)
    elif isinstance(event, LoadDelta):
        remote.apply_delta(instance_id, event)
    elif isinstance(event, LoadSnapshot):
        remote.apply_snapshot(instance_id, event)
    else:
        raise TypeError(f"unknown routing event {type(event).__name__}")
