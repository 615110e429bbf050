"""AuditLog: non-blocking fan-out of audit events to sinks, with disk spill.

``emit`` is synchronous and never awaits: it scrubs the event, then for each
sink either puts it on that sink's bounded in-memory queue or, when the queue
is full or the sink is down, appends it to the sink's spill file (a small
buffered local write). One worker task per sink delivers in order:
pending retry batch → in-memory queue → spill file, so per-sink order is the
emit order. Delivery is at-least-once (a batch that failed half-way is sent
again; receivers de-duplicate on ``event_id``).

Fail closed: when the spill files together hold more than ``spill_max_bytes``
undelivered bytes, :attr:`AuditLog.accepting` turns False and an alert is
raised; the gateway must then answer 503 to new requests. Events of requests
already in flight are still spilled up to ``spill_max_bytes`` plus a headroom
of ``max(spill_max_bytes * spill_headroom, MIN_HEADROOM_BYTES)``; only beyond
that an event is dropped and counted in
``prefixgate_audit_events_dropped_total`` (which must stay 0).

Slow sinks: a sink whose ``send`` of events taken from memory has not returned
after ``slow_send_s`` is treated like a down one for what is in memory: the
batch being sent and the sink's queue are copied to its spill file at once (in
order, before anything newer) and later events go to the spill until it is
replayed. The send itself goes on; if it succeeds, the spill's read offset
moves past the copied batch (no duplicate), if it fails the batch is retried
like any spilled batch. So :attr:`AuditLog.durable_n` (what the audit worker
acknowledges) never waits on a slow sink, and the other sinks, which have their
own tasks, are not affected either; only a full spill stops ``accepting``.

While not accepting, the events of the refusals themselves (``policy.reason_code
== "audit_unavailable"``, the gateway's 503 code) are not written one by one
(each would grow the spill that caused them, and a client retrying in a loop
would push the log past its headroom): they are counted per source and written
as ``kind="summary"`` events (``summary.reason = "audit_unavailable"``) when
the log accepts again, or at ``close()``.

This module holds the public surface and lifecycle; the delivery task is in
:mod:`audit.log_delivery`, the spill and the fail-closed gate in
:mod:`audit.log_spill`, the metrics in :mod:`audit.log_metrics`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from prometheus_client import CollectorRegistry

from audit.dirlock import lock_directory
from audit.event import AuditEvent, Kind, now_ms
from audit.scrub import scrub_event
from audit.log_delivery import DeliveryLoop, SinkWorker
from audit.log_metrics import AuditLogMetrics
from audit.log_spill import SpillGate, encode_line
from audit.sink import AuditSink, SinkUnavailable
from audit.spill import SpillFile
from audit.summary import AUDIT_UNAVAILABLE_CODE, RefusalCounter, SummaryAggregator

log = logging.getLogger(__name__)

#: Least spill headroom (bytes) kept for events of requests already in flight.
MIN_HEADROOM_BYTES = 64 * 1024


class AuditLog(SpillGate, DeliveryLoop):
    """Fan-out of audit events to sinks; see the module docstring.

    Args:
        sinks: destinations; names must be unique (they name spill files).
        spill_dir: directory of the spill files (local disk).
        spill_max_bytes: undelivered bytes (all sinks) above which
            ``accepting`` turns False.
        spill_headroom: extra fraction still spilled for in-flight requests
            (at least ``MIN_HEADROOM_BYTES``).
        queue_size: in-memory events per sink before spilling.
        batch_size: events per ``send`` call.
        retry_initial_s, retry_max_s: reconnect backoff (seconds, doubling).
        slow_send_s: seconds after which a running ``send`` of in-memory
            events counts as slow: the batch and the queue move to the spill
            (see the module docstring); None disables. Keep it well below the
            audit worker's stall limit (``RemoteAuditLog.max_backlog_age_s``).
        aggregator: optional flood aggregator (summary events).
        registry: Prometheus registry for the metrics (sink names only, no
            tenants).
        on_alert: called with every alert event this log raises itself.
    """

    def __init__(
        self,
        sinks: Sequence[AuditSink],
        spill_dir: str | Path,
        spill_max_bytes: int = 256 * 1024 * 1024,
        spill_headroom: float = 0.1,
        queue_size: int = 10_000,
        batch_size: int = 256,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 5.0,
        aggregator: SummaryAggregator | None = None,
        registry: CollectorRegistry | None = None,
        on_alert: Callable[[AuditEvent], None] | None = None,
        slow_send_s: float | None = 1.0,
        instance: str | None = None,
    ) -> None:
        if slow_send_s is not None and not slow_send_s > 0:
            raise ValueError("slow_send_s must be > 0 or None")
        names = [s.name for s in sinks]
        if len(set(names)) != len(names):
            raise ValueError(f"sink names must be unique: {names}")
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = AuditLogMetrics(self.registry)
        self._spill_dir = Path(spill_dir)
        self._spill_max = spill_max_bytes
        self._spill_hard = spill_max_bytes + max(int(spill_max_bytes * spill_headroom), MIN_HEADROOM_BYTES)
        self._retry = (retry_initial_s, retry_max_s)
        self._slow_send_s = slow_send_s
        self._aggregator = aggregator
        self._on_alert = on_alert
        self.instance = instance
        # one process per spill directory (each would replay and reset the other's files)
        self._lock = lock_directory(self._spill_dir, "audit spill directory")
        self._workers = [
            SinkWorker(s, SpillFile(self._spill_dir / f"{s.name}.spill.jsonl"), queue_size, batch_size) for s in sinks
        ]
        self._accepting = True
        self._accepting_shown: bool | None = None  # the value the accepting gauge shows
        self._flush_scheduled = False  # a flush_spills is due this event-loop turn
        self._dropped = 0
        self._n = 0
        # fail-closed refusals counted instead of written
        self._refused = RefusalCounter()
        self._flush_task: asyncio.Task[None] | None = None
        for s in sinks:
            if hasattr(s, "on_checkpoint"):
                s.on_checkpoint = self._forward_checkpoint(s.name)
        self._update_accepting()

    # ---- public API -------------------------------------------------
    @property
    def accepting(self) -> bool:
        """False while the spill is over its limit: answer new requests 503."""
        return self._accepting

    @property
    def dropped(self) -> int:
        """Events lost so far, all sinks (must stay 0)."""
        return self._dropped

    @property
    def emitted_n(self) -> int:
        """Number of events :meth:`emit` has handed to the sinks so far (events
        counted into a summary instead are not included)."""
        return self._n

    @property
    def durable_n(self) -> int:
        """Highest emit number up to which every event has left memory for
        every sink: delivered, or written to the sink's spill file. What an
        audit worker may acknowledge (a crash loses nothing at or below it).
        Flushes the spill files' write buffers first (:meth:`flush_spills`)."""
        self.flush_spills()
        durable = self._n
        for w in self._workers:
            first = w.pending_first_n if w.pending_first_n is not None else (w.queue[0][0] if w.queue else None)
            if first is not None:
                durable = min(durable, first - 1)
        return durable

    def flush_spills(self) -> None:
        """Hand every spill file's buffered lines to the kernel (appends are buffered since
        session 10: one write per batch of spilled events, not one per event; this runs before
        :attr:`durable_n` answers and once per event-loop turn after a spill). A failed write
        counts the buffered lines as dropped, as a failed append of one line did before (they
        are no longer in memory for the sink); the error is logged."""
        self._flush_scheduled = False
        for w in self._workers:
            if w.spill.dirty:
                lines = w.spill.unflushed
                try:
                    w.spill.flush()
                except OSError:
                    log.exception("audit spill write failed for sink %s (%d events)", w.sink.name, lines)
                    w.spill.discard_unflushed()
                    for _ in range(lines):
                        self._count_drop(w)

    @property
    def spill_pending_bytes(self) -> int:
        """Undelivered bytes in all spill files."""
        return sum(w.spill.pending_bytes for w in self._workers)

    def emit(self, event: AuditEvent, exclude: Iterable[str] = (), *, scrubbed: bool = False) -> None:
        """Queue ``event`` for every sink (except names in ``exclude``).

        An event that ``exclude`` keeps from every sink (a JSONL sink's own checkpoint, forwarded to the
        other sinks, when it is the only sink) is dropped before anything else: not counted in
        ``prefixgate_audit_events_emitted_total`` nor in :attr:`emitted_n`, so emitted minus delivered
        shows no false loss (session 15, review R14-3; docs/audit.md).

        Never blocks and never raises for sink trouble. The event is scrubbed
        first (see :func:`audit.scrub.scrub_event`); refused fields are counted
        in ``prefixgate_audit_fields_scrubbed_total``. ``scrubbed``: the caller has
        shown that the scrubber would return ``event`` unchanged (the audit worker:
        :func:`audit.scrub.row_is_clean` of the request row the event was built from).
        """
        if exclude:
            exclude = frozenset(exclude)  # read twice (here and below): not a one-shot iterator
            if all(w.sink.name in exclude for w in self._workers):
                return  # R14-3: it reaches no sink
        if self.instance is not None and event.instance is None:
            event = dataclasses.replace(event, instance=self.instance)
            scrubbed = False  # the instance string was not part of the caller's check
        if not scrubbed:
            event, dropped = scrub_event(event)
            for _, reason in dropped:
                self.metrics.scrubbed.labels(reason).inc()
        if (not self._accepting and event.policy.reason_code == AUDIT_UNAVAILABLE_CODE
                and event.kind is not Kind.SUMMARY):
            self._count_refusal(event)
            return
        if self._aggregator is not None:
            passed = self._aggregator.offer(event)
            if passed is None:
                return
        self.metrics.emitted.inc()
        self._n += 1
        item = (self._n, event)  # one tuple for every sink's queue (session 29)
        line: bytes | None = None
        for w in self._workers:
            if exclude and w.sink.name in exclude:  # a frozenset by now (above)
                continue
            if not w.spilling:
                queue = w.queue
                if len(queue) < w.queue_size:
                    if not queue:  # session 29: the delivery task waits only on an empty queue (_run)
                        w.wakeup.set()  # so only the first event of a burst needs to wake it
                    queue.append(item)
                    continue
                # the queue is full: what is in memory goes first, so the spill keeps emit order
                self._spill_ram(w)
            line = line or encode_line(event)
            self._spill(w, line, event)
        if line is not None or not self._accepting:  # the spill grew (or the gate is shut): check it
            self._update_accepting()

    async def start(self) -> None:
        """Open sinks (failures are retried by the workers) and start one
        delivery task per sink plus the summary flusher."""
        for w in self._workers:
            try:
                await w.sink.open()
            except SinkUnavailable as exc:
                log.warning("audit sink %s unavailable at start: %s", w.sink.name, exc)
                self._mark_down(w)
            w.task = asyncio.create_task(self._run(w), name=f"audit-sink-{w.sink.name}")
        if self._aggregator is not None:
            self._flush_task = asyncio.create_task(self._flush_summaries())

    async def drain(self, timeout_s: float = 10.0, *, reached_only: bool = False) -> bool:
        """Wait until every sink has taken everything (queue and spill empty), at most ``timeout_s``
        seconds. Returns False on timeout. ``reached_only`` (what :meth:`close` uses): a sink that is
        down and has taken nothing in this run (an unreachable SIEM host) is not waited for; what it
        holds is in its spill file already (:meth:`_mark_down`)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            if all((not w.queue and not w.spilling and w.up and not w.busy)
                   or (reached_only and not w.up and not w.delivered_once) for w in self._workers):
                return True
            await asyncio.sleep(0.01)
        return False

    async def close(self, timeout_s: float = 10.0) -> None:
        """Flush summaries, drain, close sinks (the JSONL sink writes its final
        signed checkpoint, which is forwarded to the other sinks first).
        Each of the two drains waits at most ``timeout_s`` / 2 seconds, and not
        for a sink never reached in this run (session 22, S21-newcomer-7: an
        unreachable syslog host held shutdown 10 s for nothing). Events a down
        sink could not take stay in its spill file, logged (one WARNING per such
        sink: undelivered bytes and the file), and are replayed on the next start."""
        if self._flush_task is not None:
            self._flush_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flush_task
        if self._aggregator is not None:
            for ev in self._aggregator.flush(now_ms(), force=True):
                self.emit(ev)
        self._emit_refusal_summaries()
        await self.drain(timeout_s / 2, reached_only=True)
        for w in self._workers:
            if hasattr(w.sink, "on_checkpoint"):  # checkpoint sources first
                await w.sink.close()
        await self.drain(timeout_s / 2, reached_only=True)
        for w in self._workers:
            if w.task is not None:
                w.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await w.task
            if not hasattr(w.sink, "on_checkpoint"):
                await w.sink.close()
            # anything still queued in memory goes to disk for the next run
            self._spill_ram(w)
            if w.spill.pending_bytes:
                log.warning("audit sink %s not drained at close: %d undelivered bytes kept in %s, replayed at "
                            "the next start", w.sink.name, w.spill.pending_bytes, w.spill.path)
            w.spill.close()
        self._lock.close()

    # ---- internals --------------------------------------------------
    async def _flush_summaries(self) -> None:
        """Emit the summary events of closed flood windows, periodically.

        Polls every quarter window (at most 1 s, at least 50 ms); a summary
        event is emitted like any other event (it is not aggregated itself).
        """
        assert self._aggregator is not None
        period = min(1.0, max(0.05, self._aggregator.window_s / 4))
        while True:
            await asyncio.sleep(period)
            for ev in self._aggregator.flush(now_ms()):
                self.emit(ev)

    def _forward_checkpoint(self, source: str) -> Callable[[AuditEvent], None]:
        def forward(event: AuditEvent) -> None:
            self.emit(event, exclude=(source,))

        return forward
