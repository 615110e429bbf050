"""Spilling to disk and failing closed: how :class:`audit.log.AuditLog` keeps events it cannot deliver now.

When a sink's queue is full, the sink is down or slow, its events go to its
spill file in emit order; past ``spill_max_bytes`` the log stops accepting
(the gateway answers 503) and raises an alert; past the headroom an event is
dropped and counted. See :mod:`audit.log` for the whole picture.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from audit.encoded import shared_json
from audit.event import AuditEvent, Kind, Outcome

if TYPE_CHECKING:
    from audit.log_delivery import SinkWorker

# the AuditLog's logger: these records keep the name they had before the split
log = logging.getLogger("audit.log")


def encode_line(event: AuditEvent) -> bytes:
    """One spill-file line: the event as compact, key-sorted JSON plus a newline (UTF-8): its canonical
    JSON (:meth:`audit.event.AuditEvent.to_json`, shared with the JSONL and OTLP sinks through
    :func:`audit.encoded.shared_json`; session 10: was a second stdlib ``json`` encoding, ~3x the cost;
    both read back to the same values)."""
    return shared_json(event) + b"\n"


class SpillGate:
    """The spill side of :class:`audit.log.AuditLog` (a mixin): moving a sink's
    events to its spill file in order, dropping (counted) past the hard limit,
    and the fail-closed ``accepting`` gate with its alert and refusal summaries.

    Uses the log's ``metrics``, ``_workers``, ``_spill_max``, ``_spill_hard``,
    ``_accepting``, ``_refused``, ``_on_alert`` and ``emit``."""

    def _count_refusal(self, event: AuditEvent) -> None:
        self._refused.count(event)
        self.metrics.emitted.inc()

    def _emit_refusal_summaries(self) -> None:
        for ev in self._refused.flush():
            self.emit(ev)

    def _spill(self, w: SinkWorker, line: bytes, event: AuditEvent | None = None) -> None:
        if self.spill_pending_bytes + len(line) > self._spill_hard:
            self._count_drop(w)
            log.error("audit spill full: event dropped for sink %s", w.sink.name)
            return
        try:
            w.spill.append(line, event)  # flushed before an ack (AuditLog.durable_n) or a read
        except OSError:
            self._count_drop(w)
            log.exception("audit spill write failed for sink %s", w.sink.name)
            return
        self.metrics.child("spill_bytes", w.sink.name).set(w.spill.pending_bytes)
        if not self._flush_scheduled:  # the buffered lines reach the file this event-loop turn
            self._flush_scheduled = True
            try:
                asyncio.get_running_loop().call_soon(self.flush_spills)
            except RuntimeError:  # no running loop (a synchronous caller): at once
                self.flush_spills()
        w.wakeup.set()

    def _spill_ram(self, w: SinkWorker) -> None:
        """Move the sink's in-memory events to its spill file, in order, and
        spill everything after them (``spilling``).

        The batch taken from the queue (``pending``, possibly being sent right
        now) is copied and stays the batch to (re)send, now as a spilled batch:
        once it is delivered the spill's offset moves past the copy
        (``commit_to``), so a send that ends well causes no duplicate. Then the
        queue. Every event emitted earlier than the spill's content is in memory
        only while the spill is empty, so the copy goes before anything newer.
        """
        w.spilling = True
        if w.pending_first_n is not None:
            empty_before = w.spill.pending_bytes == 0
            for ev in w.pending:
                self._spill(w, encode_line(ev), ev)
            w.pending_first_n = None
            # commit past the copy only if nothing undelivered precedes it (always
            # the case, see above; otherwise a delivery may leave a duplicate)
            w.commit_to = w.spill.end_offset if empty_before else None
        while w.queue:
            ev = w.queue.popleft()[1]
            self._spill(w, encode_line(ev), ev)

    def _on_slow_send(self, w: SinkWorker) -> None:
        """``slow_send_s`` passed and the sink's send of in-memory events still
        runs: move them (and the queue) to the spill, see the module docstring."""
        if w.pending_first_n is None:
            return
        log.warning("audit sink %s slow (send running for more than %g s): spilling its events",
                    w.sink.name, self._slow_send_s)
        self.metrics.child("slow_sends", w.sink.name).inc()
        self._spill_ram(w)
        self._update_accepting()

    def _count_drop(self, w: SinkWorker) -> None:
        self._dropped += 1
        self.metrics.child("dropped", w.sink.name).inc()

    def _update_accepting(self) -> None:
        pending = self.spill_pending_bytes
        if self._accepting and pending >= self._spill_max:
            self._accepting = False
            self._raise_alert(Outcome.RAISED, pending)
        elif not self._accepting and pending < self._spill_max // 2:
            self._accepting = True
            self._raise_alert(Outcome.CLEARED, pending)
            self._emit_refusal_summaries()
        if self._accepting is not self._accepting_shown:  # the gauge only when it changes (once per emit before)
            self.metrics.accepting.set(1 if self._accepting else 0)
            self._accepting_shown = self._accepting

    def _raise_alert(self, outcome: Outcome, pending: int) -> None:
        alert = AuditEvent(
            kind=Kind.ALERT,
            outcome=outcome,
            alert={
                "alert_id": "audit-spill-full",
                "alert_kind": "audit_spill_full",
                "spill_pending_bytes": pending,
                "spill_max_bytes": self._spill_max,
            },
        )
        log.error("audit alert %s: spill %d/%d bytes", outcome.value, pending, self._spill_max)
        if self._on_alert is not None:
            self._on_alert(alert)
        # recorded like any event (goes to spill for down sinks, within headroom)
        self.emit(alert)
