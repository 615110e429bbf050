"""Gateway side of the audit worker process (see :mod:`audit.worker`).

:class:`RemoteAuditLog` has the surface of :class:`audit.log.AuditLog` the
gateway uses (``emit``, ``start``, ``drain``, ``close``, ``accepting``,
``dropped``, ``spill_pending_bytes``) but runs every sink in a child
process. ``emit`` costs the gateway one canonical JSON encoding of the event
(``emit_request_row``: of a request's flat row, :mod:`audit.request_event`;
the worker builds the event) and a buffered pipe write per event loop iteration; formatting (hash chain,
OCSF, CEF, OTLP) and sink I/O happen on another core.

Delivery: every event carries a sequence number; the worker acknowledges
the highest one whose events have left its memory for every sink
(delivered, or written to the sink's spill file:
:attr:`audit.log.AuditLog.durable_n`). Unacknowledged frames stay in the
gateway's memory (the *backlog*) and are sent again, in order, to a
restarted worker when the worker dies (duplicates are possible and carry the
same ``event_id``), so a worker crash loses no event.

Fail closed: :attr:`accepting` is False while the worker's own spill is over
its limit (the worker's ``accepting``), the backlog exceeds
``max_backlog_bytes`` (worker down or too slow) or its oldest event waits
longer than ``max_backlog_age_s`` (worker hung); the gateway answers 503.
Events of requests already in flight are still kept up to the backlog limit
plus ``max(max_backlog_bytes * headroom, 1 MiB)``; beyond that an event is
dropped and counted (``prefixgate_audit_worker_events_dropped_total``, must
stay 0). While not accepting, the gateway's own 503 refusal events are
counted per source (:class:`audit.summary.RefusalCounter`) and written as
summary events once the trail accepts again.

This module's one job is the gateway-side trail (framing, backlog, flushing,
the fail-closed gate); starting, reading and restarting the child is
:mod:`audit.worker_process`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from audit.event import AuditEvent, Kind, Outcome
from audit.log_metrics import WorkerLogMetrics
from audit.request_event import request_event
from audit.spool import Spool, spool_dir
from audit.summary import AUDIT_UNAVAILABLE_CODE, RefusalCounter
from audit.worker_process import AuditWorkerError, WorkerProcess

log = logging.getLogger(__name__)


_dumps, _NL = orjson.dumps, orjson.OPT_APPEND_NEWLINE
#: Buffered frame bytes that trigger a pipe write before the flush interval.
FLUSH_BYTES = 1 << 16
#: Least backlog headroom (bytes) kept for events of requests already in flight.
MIN_HEADROOM_BYTES = 1 << 20


class RemoteAuditLog(WorkerProcess):
    """Audit log whose sinks run in an :mod:`audit.worker` child process.

    Args:
        config: the ``audit`` config section for :func:`audit.config.build_audit`
            (sinks, spill, summary); sent to the worker on its stdin.
        max_backlog_bytes: unacknowledged bytes above which ``accepting`` is
            False (default 32 MiB).
        headroom: extra fraction kept for in-flight requests' events.
        restart_initial_s, restart_max_s: worker restart backoff (seconds, doubling).
        start_timeout_s: seconds to wait for the worker's ``ready``.
        registry: Prometheus registry for the gateway-side metrics.
        python: interpreter for the worker (default ``sys.executable``).
        flush_interval_s: longest time an event waits in the gateway before the
            pipe write (seconds; a write also happens at ``FLUSH_BYTES``).
        max_backlog_age_s: an unacknowledged event older than this (seconds)
            means the worker is hung or stopped: ``accepting`` turns False.
            The config's ``slow_send_s`` (default 1 s) is capped at a quarter
            of it, so that a slow sink's events reach its spill (and are
            acknowledged) long before.
    """

    def __init__(self, config: Mapping[str, Any], *, max_backlog_bytes: int = 32 << 20, headroom: float = 0.1,
                 restart_initial_s: float = 0.1, restart_max_s: float = 5.0, start_timeout_s: float = 30.0,
                 registry: CollectorRegistry | None = None, python: str | None = None,
                 flush_interval_s: float = 0.02, max_backlog_age_s: float = 5.0) -> None:
        doc = dict(config)
        # a sink send of in-memory events running longer than slow_send_s moves them to
        # the sink's spill, so acknowledgements never wait on a slow (not dead) sink;
        # kept well below the stall limit, else a slow sink would read as a hung worker
        doc["slow_send_s"] = min(float(doc.get("slow_send_s", 1.0)), max_backlog_age_s / 4)
        self._doc = doc
        self._config = orjson.dumps(doc)
        self._spool: Spool | None = None  # audit/spool.py, opened by start() when there is a JSONL sink
        self._max_backlog = max_backlog_bytes
        self._hard = max_backlog_bytes + max(int(max_backlog_bytes * headroom), MIN_HEADROOM_BYTES)
        self._restart = (restart_initial_s, restart_max_s)
        self._start_timeout = start_timeout_s
        self._python = python or sys.executable
        self.registry = registry if registry is not None else CollectorRegistry()
        self.metrics = WorkerLogMetrics(self.registry)
        # read at each scrape instead of set at every flush (issue 14)
        self.metrics.backlog.set_function(lambda: self._backlog)
        self._seq = 0
        # (seq, frame, monotonic time sent), oldest first
        self._unacked: collections.deque[tuple[int, bytes, float]] = collections.deque()
        self._backlog = 0
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._flush_interval = flush_interval_s
        self._max_age = max_backlog_age_s
        self._flush_scheduled = False
        self._proc: asyncio.subprocess.Process | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None
        self._worker_accepting = True
        self._worker_dropped = 0
        self._worker_spill = 0
        self._dropped = 0
        self._refused = RefusalCounter()
        self._replies: dict[int, asyncio.Future[bool]] = {}
        self._next_id = 0
        self._closing = False
        self._accepting = True
        self._live = False
        self.worker_metrics_text = b""
        self.worker_pid: int | None = None

    # ---- AuditLog surface -------------------------------------------------
    @property
    def accepting(self) -> bool:
        """False while the worker's spill or the backlog is over its limit, or
        the oldest unacknowledged event is older than ``max_backlog_age_s``
        (worker hung or stopped): answer 503. While accepting, only the oldest event's age can
        have ended it since the last re-evaluation (the backlog grows in :meth:`_send`, the
        worker's own gate changes in ``_read``, both re-evaluate): that is checked inline
        (session 17: one call per request, not three)."""
        unacked = self._unacked
        if self._accepting and (not unacked or time.monotonic() - unacked[0][2] <= self._max_age):
            return True
        self._update_accepting()
        return self._accepting

    @property
    def dropped(self) -> int:
        """Events lost so far: here (backlog over its hard limit) plus the worker's own count."""
        return self._dropped + self._worker_dropped

    @property
    def spill_pending_bytes(self) -> int:
        """Undelivered bytes in the worker's spill files plus this side's backlog."""
        return self._worker_spill + self._backlog

    def emit(self, event: AuditEvent, exclude: Iterable[str] = ()) -> None:
        """Send ``event`` to the worker; never blocks, never raises for worker trouble.

        The worker scrubs the event (:func:`audit.scrub.scrub_event`) before
        any sink or spill file sees it. ``exclude`` is not
        supported across the pipe (checkpoint forwarding happens inside the
        worker) and must be empty.
        """
        if exclude:
            raise ValueError("RemoteAuditLog.emit: exclude is handled inside the worker")
        if (not self._accepting and event.policy.reason_code == AUDIT_UNAVAILABLE_CODE
                and event.kind is not Kind.SUMMARY):
            self._refused.count(event)
            return
        self._seq += 1
        self._send(b'{"t":"e","s":%d,"e":%b}\n' % (self._seq, event.to_json()), event.event_id)

    def emit_request_row(self, row: Sequence[Any], spans: Sequence[Any] | None = None) -> None:
        """Send a request's audit event as its request row (:mod:`audit.request_event`):
        the worker builds the event; this side encodes one flat array. Same
        delivery as :meth:`emit`; while the trail is not accepting, the event is
        built here and goes through :meth:`emit` (refusal counting).

        ``spans``: the request's span extra (:mod:`audit.row_spans`; the config's ``spans``
        section: the worker exports the request's spans), sent in the row's frame (``"x"``): a
        resent frame may export the spans again (best-effort telemetry, like every span). While
        not accepting, it goes in a frame of its own, without sequence number, backlog or resend."""
        if not self._accepting:
            self.emit(request_event(row))
            if spans is not None:
                frame = b'{"t":"x","r":%b,"x":%b}\n' % (orjson.dumps(row), orjson.dumps(spans))
                self._out.append(frame)
                self._out_bytes += len(frame)
                self._schedule_flush()
            return
        seq = self._seq = self._seq + 1
        # one orjson call per frame (session 10: ~1 us less, same bytes: tests/audit/test_s10_span_handoff.py)
        frame = _dumps({"t": "r", "s": seq, "r": row} if spans is None else {"t": "r", "s": seq, "r": row, "x": spans},
                       option=_NL)
        size = len(frame)
        backlog = self._backlog + size
        if backlog > self._hard:
            self._send(frame, row[0])  # dropped and counted there
            return
        # session 17: _send and _schedule_flush inline (the same steps in the same order, two calls less)
        now = time.monotonic()
        unacked = self._unacked
        unacked.append((seq, frame, now))
        self._backlog = backlog
        self._out.append(frame)
        out_bytes = self._out_bytes = self._out_bytes + size
        if out_bytes >= FLUSH_BYTES:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(self._flush_interval, self._on_flush_timer)
        if backlog >= self._max_backlog or now - unacked[0][2] > self._max_age:
            self._update_accepting()

    def _send(self, frame: bytes, event_id: str | None) -> None:
        """Queue one event frame (sequence number already taken) for the worker."""
        if self._backlog + len(frame) > self._hard:
            self._dropped += 1
            self.metrics.dropped.inc()
            log.error("audit worker backlog full: event %s dropped", event_id)
            return
        now = time.monotonic()
        self._unacked.append((self._seq, frame, now))
        self._backlog += len(frame)
        self._out.append(frame)
        self._out_bytes += len(frame)
        self._schedule_flush()
        # while accepting, only the backlog size or the oldest event's age can end it here
        # (the worker's own accepting is re-evaluated where it changes: _read)
        if (not self._accepting or self._backlog >= self._max_backlog
                or now - self._unacked[0][2] > self._max_age):
            self._update_accepting()

    async def start(self) -> None:
        """Spawn the worker and wait for it to report ready.

        Raises:
            AuditWorkerError: the worker refused the config (the message names
                the worker-side error) or did not become ready in time.
        """
        if (d := spool_dir(self._doc)) is not None and self._spool is None:
            self._spool = Spool(d)  # the worker recovers earlier processes' segments (below ours)
            self._config = orjson.dumps({**self._doc, "spool": {"dir": str(d), "below": self._spool.first}})
        self._flush_scheduled = False  # a timer armed on an earlier event loop never fires
        try:
            await self._spawn()
        except BaseException:
            if self._spool is not None:
                self._spool.close(remove=True)  # nothing written yet
                self._spool = None
            raise
        self._supervisor = asyncio.create_task(self._supervise(), name="audit-worker-supervisor")

    async def close(self, timeout_s: float = 10.0) -> None:
        """Flush refusal summaries, ask the worker to drain and close its sinks
        (final signed checkpoint), wait for it to exit (killed after
        ``timeout_s`` + 5 s). Unacknowledged events left after that are
        counted as dropped."""
        self._closing = True
        for ev in self._refused.flush():
            self.emit(ev)
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if self._unacked and not self._worker_alive() and self._ready is not None:
            # the worker died and its restart is still backing off: one last try now,
            # so the backlog reaches the sinks instead of being lost
            if self._proc is not None and self._proc.returncode is None:
                self._proc.kill()
                await self._proc.wait()
            try:
                await self._spawn()
            except AuditWorkerError as exc:
                log.error("audit worker restart at close failed: %s", exc)
        proc = self._proc
        if proc is not None and proc.returncode is None:
            if not self._live and proc.stdin is not None:  # started but never ready: just close it
                proc.stdin.close()
            self._write_control({"t": "close", "timeout": timeout_s})
            try:
                await asyncio.wait_for(proc.wait(), timeout_s + 5.0)
            except asyncio.TimeoutError:
                log.error("audit worker did not exit in time; killed")
                proc.kill()
                await proc.wait()
        if self._reader_task is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(self._reader_task, 2.0)
        if self._spool is not None:  # all acknowledged: nothing to recover; else the next start's worker does
            self._spool.close(remove=not self._unacked)
        if self._unacked:
            lost = len(self._unacked)
            self._dropped += lost
            self.metrics.dropped.inc(lost)
            log.error("audit worker gone at close: %d unacknowledged events lost", lost)
            self._unacked.clear()
            self._backlog = 0
        self.metrics.up.set(0)

    # ---- internals ------------------------------------------------------
    def _worker_alive(self) -> bool:
        """True once a worker is ready *and* has been sent the backlog (order)."""
        return self._live and self._proc is not None and self._proc.returncode is None

    def _schedule_flush(self) -> None:
        # one pipe write per ``flush_interval_s`` (or per ``FLUSH_BYTES``), not per
        # event: a write syscall per event cost the gateway more than encoding it.
        # The timer is armed only by an event and only when none is armed; a hand-off
        # (flush_now) leaves an armed timer alone (it was armed before any event now
        # pending, so it still fires within flush_interval_s of each), and one that
        # fires with nothing pending is not re-armed: sequential answers arm one timer
        # per flush interval, not one per answer (issue 14; cancelling it at every
        # hand-off and arming it again at the next event costs more than letting it fire)
        if self._out_bytes >= FLUSH_BYTES:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_later(self._flush_interval, self._on_flush_timer)

    def _on_flush_timer(self) -> None:
        self._flush_scheduled = False
        self._flush()

    def flush_now(self) -> None:
        """Write every queued event frame to the worker's pipe now (one ``write``), without waiting for
        ``flush_interval_s``: the gateway calls it before an answer's last byte, so that a gateway
        SIGKILLed after answering has already handed the answer's event to the worker (which
        outlives it and closes the trail on stdin EOF). What the pipe does not take at once (worker
        more than a pipe buffer behind), or while no worker runs, stays in this process's backlog.
        The same step as the flush timer's and the byte bound's (``_flush`` is this method: one call
        per hand-off, session 17)."""
        if not self._out:
            return
        out, self._out, self._out_bytes = self._out, [], 0
        data = out[0] if len(out) == 1 else b"".join(out)  # one answer's frame per hand-off, mostly
        if self._spool is not None:  # survives this process and the worker (audit/spool.py)
            self._spool.write(data)
        proc = self._proc
        if self._live and proc is not None and proc.returncode is None:  # _worker_alive, inline (session 15)
            try:  # StreamWriter.write's one call, without it (one call less per hand-off)
                proc.stdin.transport.write(data)  # type: ignore[union-attr]
            except (ConnectionError, RuntimeError):
                pass  # the supervisor notices the exit and resends the backlog
        # else: the frames stay in the backlog and are resent to the next worker

    _flush = flush_now

    def _write_control(self, frame: dict[str, Any]) -> None:
        self._flush()
        if self._worker_alive():
            assert self._proc is not None and self._proc.stdin is not None
            with contextlib.suppress(ConnectionError, RuntimeError):
                self._proc.stdin.write(orjson.dumps(frame) + b"\n")

    def _stalled(self) -> bool:
        return bool(self._unacked) and time.monotonic() - self._unacked[0][2] > self._max_age

    def _update_accepting(self) -> None:
        stalled = self._stalled()
        ok = self._worker_accepting and self._backlog < self._max_backlog and not stalled
        if ok == self._accepting:
            return
        self._accepting = ok
        if ok:
            for ev in self._refused.flush():
                self.emit(ev)
        else:
            log.error("audit trail not accepting (worker accepting=%s, backlog %d/%d bytes, stalled=%s)",
                      self._worker_accepting, self._backlog, self._max_backlog, stalled)
            if stalled:
                self.emit(AuditEvent(kind=Kind.ALERT, outcome=Outcome.RAISED, alert={
                    "alert_id": "audit-worker-stalled", "alert_kind": "audit_worker_stalled",
                    "oldest_unacknowledged_s": round(time.monotonic() - self._unacked[0][2], 3),
                    "max_backlog_age_s": self._max_age}))
            elif self._backlog >= self._max_backlog:
                self.emit(AuditEvent(kind=Kind.ALERT, outcome=Outcome.RAISED, alert={
                    "alert_id": "audit-worker-backlog", "alert_kind": "audit_worker_backlog",
                    "backlog_bytes": self._backlog, "max_backlog_bytes": self._max_backlog}))

    def _ack(self, seq: int) -> None:
        while self._unacked and self._unacked[0][0] <= seq:
            _, frame, _ = self._unacked.popleft()
            self._backlog -= len(frame)
        if self._spool is not None:
            self._spool.acked(seq, self._seq)
