"""One sink's delivery state (queue, spill file, pending batch) and the task that delivers it in emit order.

Part of :class:`audit.log.AuditLog`; see that module's docstring for the
ordering and at-least-once rules.
"""

from __future__ import annotations

import asyncio
import collections
import logging

from audit.backoff import Backoff
from audit.event import AuditEvent
from audit.sink import AuditSink, SinkUnavailable
from audit.spill import SpillCorrupt, SpillFile

# the AuditLog's logger: these records keep the name they had before the split
log = logging.getLogger("audit.log")


class QueueFull(Exception):
    """A sink's in-memory queue is at ``queue_size``."""


def take_batch(queue: collections.deque[tuple[int, AuditEvent]], size: int) -> list[AuditEvent]:
    """The events of the oldest ``size`` (or fewer) ``(emit number, event)`` pairs, removed from ``queue``,
    oldest first. The whole queue in one pass when it fits (session 29: the usual case in the audit
    worker, where a sink takes each read's burst at once), instead of a ``popleft`` per event."""
    if len(queue) <= size:
        batch = [event for _, event in queue]
        queue.clear()
        return batch
    popleft = queue.popleft
    return [popleft()[1] for _ in range(size)]


class SinkWorker:
    """Queue + spill + delivery task for one sink."""

    def __init__(self, sink: AuditSink, spill: SpillFile, queue_size: int, batch_size: int) -> None:
        self.sink = sink
        self.spill = spill
        # (emit number, event), oldest first; bounded by ``queue_size``
        self.queue: collections.deque[tuple[int, AuditEvent]] = collections.deque()
        self.queue_size = queue_size
        self.batch_size = batch_size
        self.spilling = spill.pending_bytes > 0  # leftovers of a previous run
        self.up = True
        self.task: asyncio.Task[None] | None = None
        self.wakeup = asyncio.Event()
        self.pending: list[AuditEvent] = []
        # emit number of pending[0] when the batch came from the in-memory queue
        # (None: empty, or read from the spill file, i.e. already on disk)
        self.pending_first_n: int | None = None
        # spill offset to commit once ``pending`` is delivered (None: nothing to
        # commit): set when the batch was read from the spill, or copied to it
        self.commit_to: int | None = None
        self.busy = False
        # a send succeeded in this run: close() waits for such a sink even while it is down
        # (it may come back); one never reached is not waited for (session 22, S21-newcomer-7)
        self.delivered_once = False
        # seconds a sink lets events accumulate before a send (sink attribute
        # ``linger_s``; 0 = send what is there): network sinks batch, files don't
        self.linger_s = float(getattr(sink, "linger_s", 0.0) or 0.0)


class DeliveryLoop:
    """The delivery side of :class:`audit.log.AuditLog` (a mixin): one task per
    sink sends pending retry batch -> in-memory queue -> spill file, in order,
    with backoff while the sink is down.

    Uses the log's ``metrics``, ``_retry``, ``_slow_send_s`` and its spill
    methods (:class:`audit.log_spill.SpillGate`)."""

    def _mark_down(self, w: SinkWorker) -> None:
        """The sink is down: what it holds in memory goes to disk now (in order)
        rather than wait in memory for the whole outage; later events spill."""
        w.up = False
        self._spill_ram(w)
        self.metrics.child("sink_up", w.sink.name).set(0)

    async def _deliver(self, w: SinkWorker, batch: list[AuditEvent]) -> bool:
        try:
            await w.sink.send(batch)
        except SinkUnavailable as exc:
            if w.up:
                log.warning("audit sink %s down: %s", w.sink.name, exc)
            self._mark_down(w)
            return False
        if not w.up:
            log.info("audit sink %s back", w.sink.name)
        w.up = w.delivered_once = True
        self.metrics.child("sink_up", w.sink.name).set(1)
        self.metrics.child("delivered", w.sink.name).inc(len(batch))
        return True

    async def _run(self, w: SinkWorker) -> None:
        backoff = Backoff(*self._retry)
        loop = asyncio.get_running_loop()
        while True:
            w.busy = bool(w.pending)
            if not w.pending:
                if w.queue:
                    if w.linger_s > 0 and len(w.queue) < w.batch_size:
                        await asyncio.sleep(w.linger_s)  # let a batch build up (fewer requests/writes)
                    if not w.queue:  # moved to the spill meanwhile (queue full, sink down)
                        continue
                    w.pending_first_n = w.queue[0][0]
                    w.pending = take_batch(w.queue, w.batch_size)
                    w.commit_to = None
                elif w.spilling:
                    try:
                        w.pending, end = w.spill.read_batch(w.batch_size)
                    except SpillCorrupt:
                        log.exception("audit spill corrupt for sink %s; skipping to end", w.sink.name)
                        self._count_drop(w)
                        w.spill.reset()
                        continue
                    if not w.pending:
                        # caught up: no await between this check and the flip
                        w.spill.reset()
                        w.spilling = False
                        self.metrics.child("spill_bytes", w.sink.name).set(0)
                        self._update_accepting()
                        continue
                    w.commit_to = end
                else:
                    # idle until emit() or _spill() sets the wakeup; the event stays in
                    # the queue until this task takes it, so drain() never sees a moment
                    # where an event is neither queued nor pending
                    w.busy = False
                    w.wakeup.clear()
                    await w.wakeup.wait()
                    continue
            w.busy = True
            slow_timer = None
            if w.pending_first_n is not None and self._slow_send_s is not None:
                slow_timer = loop.call_later(self._slow_send_s, self._on_slow_send, w)
            try:
                delivered = await self._deliver(w, w.pending)
            finally:
                if slow_timer is not None:
                    slow_timer.cancel()
            if delivered:
                w.pending = []
                w.pending_first_n = None
                if w.commit_to is not None:
                    w.spill.commit(w.commit_to)
                    self.metrics.child("spill_bytes", w.sink.name).set(w.spill.pending_bytes)
                    self._update_accepting()
                    w.commit_to = None
                backoff.reset()
            else:
                # _deliver marked the sink down, which moved the batch and the queue
                # to the spill; the batch is retried (then the spill replayed)
                await asyncio.sleep(backoff.next())
