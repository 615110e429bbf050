"""The audit worker process: every sink of the audit trail, off the gateway's event loop.

``python -m audit.worker`` (spawned by :class:`audit.remote.RemoteAuditLog`;
not meant to be started by hand). The gateway is one Python process whose
event loop is the throughput bottleneck; formatting events for each sink
(hash chain, OCSF, CEF, OTLP protobuf), the sink I/O, the spill files, the
flood aggregation and the signed checkpoints all run here instead, on
another core. The gateway only encodes each event once (canonical JSON) and
writes it to this process's stdin; this process reads that pipe at most once
per ``READ_INTERVAL_S`` (:mod:`audit.worker_stdin`), so under load it wakes once
per batch of answers, not once per answer.

Protocol (newline-delimited JSON, UTF-8; one object per line):

* stdin, first line: the ``audit`` config section (the shape of
  :func:`audit.config.build_audit`; sent on the pipe, not in argv, because it
  may hold collector credentials).
* stdin, then: ``{"t":"e","s":SEQ,"e":EVENT}`` (an event as
  :meth:`audit.event.AuditEvent.to_dict`, SEQ increasing), ``{"t":"r","s":SEQ,"r":ROW}``
  (a request's event as its flat row, :mod:`audit.request_event`; built here; with ``"x":EXTRA``
  its span extra, the request's spans built and exported here: :mod:`audit.worker_spans`),
  ``{"t":"x","r":ROW,"x":EXTRA}`` (spans only),
  ``{"t":"drain","id":K,"timeout":S}``, ``{"t":"close","timeout":S}``.
* stdout: ``{"t":"ready","pid":P}`` once the sinks are built and started, or
  ``{"t":"error","type":NAME,"message":TEXT}`` and exit status 2;
  ``{"t":"status","ack":SEQ,"accepting":B,"dropped":N,"spill":BYTES}``
  after a read chunk if it changed, and whenever it changes (SEQ = highest event that has
  left this process's memory for every sink: delivered or written to the
  sink's spill file, see :class:`_AckTracker`); ``{"t":"reply","id":K,"ok":B}`` for a drain;
  ``{"t":"metrics","text":EXPOSITION}`` every second (Prometheus text of the
  worker's audit registry); ``{"t":"closed"}`` after close.

stdin EOF (the gateway exited, even by SIGKILL) closes the log the same way
as ``close``: summaries flushed, sinks drained, final signed checkpoint.
SIGINT and SIGTERM are ignored (a terminal's Ctrl-C reaches the whole process
group; the gateway decides when the audit trail closes). Nothing but this
protocol goes to stdout; diagnostics go to stderr and never hold event
contents beyond ids.
"""
from __future__ import annotations

import asyncio
import collections
import gc
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, generate_latest

from audit.event import AuditEvent, EventSchemaError
from audit.request_event import REQUEST_ROW_FIELDS, request_event
from audit.scrub import row_is_clean
from audit.spool import recover
from audit.worker_stdin import READ_INTERVAL_S, BatchedPipeReader

log = logging.getLogger("prefixgate.audit.worker")

_FP_INDEX = REQUEST_ROW_FIELDS.index("prefix_fingerprint")
#: Seconds between metrics frames.
METRICS_PERIOD_S = 1.0
#: Seconds between checks for a changed status (accepting, dropped, spill bytes).
STATUS_PERIOD_S = 0.05
#: Least seconds between two status frames sent after input when only the acknowledgement or the
#: spill bytes moved (session 10, issue 14: one frame per answer cost the gateway a read and a loop
#: turn per request, ~0.8 of its 6.3 loop turns per plain request); a change of ``accepting`` or
#: ``dropped`` is sent at once, and ``_report_loop`` sends what is pending within ``STATUS_PERIOD_S``.
ACK_MIN_INTERVAL_S = 0.01


class _Out:
    """Writes protocol frames to the original stdout (fd 1)."""

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self.transport = transport

    def send(self, frame: dict[str, Any]) -> None:
        if not self.transport.is_closing():
            self.transport.write(orjson.dumps(frame) + b"\n")


async def _open_pipes() -> tuple[BatchedPipeReader, _Out]:
    """stdin read at most once per ``READ_INTERVAL_S`` (:mod:`audit.worker_stdin`: one wake per
    batch of answers, not per answer); stdout as an asyncio write pipe."""
    loop = asyncio.get_running_loop()
    reader = BatchedPipeReader(0, READ_INTERVAL_S)
    out_fd = os.dup(1)
    os.dup2(2, 1)  # stray prints must never corrupt the protocol
    sys.stdout = sys.stderr
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(out_fd, "wb", buffering=0))
    return reader, _Out(transport)


def _status(audit: Any, tracker: _AckTracker) -> dict[str, Any]:
    return {"t": "status", "ack": tracker.ack(), "accepting": bool(audit.accepting),
            "dropped": int(audit.dropped) + tracker.bad_frames, "spill": int(audit.spill_pending_bytes)}


class _AckTracker:
    """Maps the gateway's sequence numbers to the audit log's durability.

    An event is acknowledged only once it has left this process's memory for
    every sink (delivered, or written to the sink's spill file:
    :attr:`audit.log.AuditLog.durable_n`), so a SIGKILLed worker loses nothing
    the gateway would not send again. Events folded into a summary count as
    taken once everything emitted before them is durable.
    """

    def __init__(self, audit: Any) -> None:
        self.audit = audit
        self._marks: collections.deque[tuple[int, int]] = collections.deque()  # (emitted_n after, seq)
        self._ack = 0
        #: frames refused as malformed (reported as dropped events: must stay 0)
        self.bad_frames = 0
        #: the last status frame sent (one is sent only when it changed: the gateway hands an
        #: answer's event over at once, so a read per answer must not cost a status per answer)
        self.last_status: dict[str, Any] | None = None
        self._last_sent = 0.0  # time.monotonic() of the last status frame sent

    def report(self, out: "_Out", force: bool = False, paced: bool = False) -> None:
        """Send the status frame if it changed since the last one (or ``force``).

        ``paced`` (after input): a frame whose only changes are ``ack`` and ``spill`` waits until
        :data:`ACK_MIN_INTERVAL_S` has passed since the last one (a later input or
        ``_report_loop`` sends it); the gateway keeps unacknowledged events a little longer, which
        its backlog bounds already cover. ``accepting`` and ``dropped`` changes are never delayed.
        """
        status = _status(self.audit, self)
        last = self.last_status
        if not force and status == last:
            return
        now = time.monotonic()
        if (paced and not force and last is not None and now - self._last_sent < ACK_MIN_INTERVAL_S
                and status["accepting"] == last["accepting"] and status["dropped"] == last["dropped"]):
            return
        out.send(status)
        self.last_status = status
        self._last_sent = now

    def emitted(self, seq: int) -> None:
        """Record that frame ``seq`` was handed to ``audit.emit``."""
        self._marks.append((self.audit.emitted_n, seq))

    def ack(self) -> int:
        """Highest sequence number whose events are all durable (after
        :meth:`AuditLog.close` that is every one: close spills what it could not
        deliver)."""
        durable = self.audit.durable_n
        while self._marks and self._marks[0][0] <= durable:
            self._ack = self._marks.popleft()[1]
        return self._ack


async def _report_loop(out: _Out, registry: CollectorRegistry, audit: Any, tracker: _AckTracker) -> None:
    """Status whenever it changes without input (a sink came back and the spill
    drained, so the trail accepts again), checked every ``STATUS_PERIOD_S``;
    metrics every ``METRICS_PERIOD_S``."""
    loop = asyncio.get_running_loop()
    next_metrics = 0.0
    while True:
        tracker.report(out)
        if loop.time() >= next_metrics:
            out.send({"t": "metrics", "text": generate_latest(registry).decode()})
            next_metrics = loop.time() + METRICS_PERIOD_S
        await asyncio.sleep(STATUS_PERIOD_S)


#: the cyclic GC's young-generation threshold once the sinks are up (CPython's default: 700)
GC_YOUNG_THRESHOLD = 5000


def _tune_gc() -> None:
    """What ``gateway.server.freeze_startup_objects`` does for the gateway, for this process (session 11):
    the objects alive after start-up (modules, sinks, aiohttp, protobuf classes) leave the cyclic GC's
    reach (``gc.freeze``), and a young collection comes every 5000 net allocations instead of 700: at 700
    one came every ~90 events, found the queued events (alive by design) and cost ~0.4 ms, ~2.5 us per
    event (bench.audit_overhead_worker's ``gc_us``)."""
    gc.collect()
    gc.freeze()
    young, *older = gc.get_threshold()
    if 0 < young < GC_YOUNG_THRESHOLD:
        gc.set_threshold(GC_YOUNG_THRESHOLD, *older)


async def run() -> int:
    """Serve the protocol until close or stdin EOF; returns the exit status."""
    from audit.config import build_audit

    reader, out = await _open_pipes()
    first = await reader.readline()
    registry = CollectorRegistry()
    try:
        config = orjson.loads(first)
        spool = config.pop("spool", None)  # {"dir", "below"}: audit/spool.py (not an audit config key)
        spans_cfg = config.pop("spans", None)  # audit/worker_spans.py (not an audit config key)
        spans = None
        audit = build_audit(config, registry=registry, input_batched=True)  # one burst per read
        await audit.start()
        if spans_cfg:  # the gateway's request spans, built here from the rows (audit/row_spans.py)
            from audit.worker_spans import WorkerSpans

            spans = WorkerSpans(spans_cfg, registry)
        if spool:  # earlier gateway processes' acknowledged events the chain lacks (group kill)
            await recover(audit, Path(spool["dir"]), Path(config["jsonl"]["dir"]), int(spool["below"]))
    except Exception as exc:  # reported to the gateway, which fails its start with it
        out.send({"t": "error", "type": type(exc).__name__, "message": str(exc)})
        await asyncio.sleep(0.05)
        return 2
    out.send({"t": "ready", "pid": os.getpid()})
    _tune_gc()
    tracker = _AckTracker(audit)
    instance = getattr(audit, "instance", None)
    instance_clean = row_is_clean((instance, None), 1)  # the one value of the event not in its row
    metrics = asyncio.create_task(_report_loop(out, registry, audit, tracker))
    buf = b""
    close_timeout = 10.0
    try:
        while True:
            chunk = await reader.read()
            if not chunk:
                break
            lines = (buf + chunk).split(b"\n")
            buf = lines.pop()
            stop = False
            for line in lines:
                if not line:
                    continue
                try:
                    frame = orjson.loads(line)
                    t = frame["t"]
                    if t == "r":  # built with the instance already stamped (no replace in emit)
                        row = frame["r"]
                        # the flat row checked instead of the event's groups (audit.scrub.row_is_clean)
                        audit.emit(request_event(row, instance),
                                   scrubbed=instance_clean and row_is_clean(row, _FP_INDEX))
                        tracker.emitted(int(frame["s"]))
                        if spans is not None and "x" in frame:
                            spans.request(frame["r"], frame["x"])
                    elif t == "x":  # a request's spans alone (its event went as an "e" frame): never
                        if spans is not None:  # a lost event, whatever its shape (refused in WorkerSpans)
                            spans.request(frame.get("r"), frame.get("x"))
                    elif t == "e":
                        audit.emit(AuditEvent.from_dict(frame["e"]))
                        tracker.emitted(int(frame["s"]))
                    elif t == "drain":
                        ok = await audit.drain(float(frame.get("timeout", 10.0)))
                        tracker.report(out, force=True)
                        out.send({"t": "reply", "id": frame["id"], "ok": ok})
                    elif t == "close":
                        close_timeout = float(frame.get("timeout", 10.0))
                        stop = True
                        break
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, EventSchemaError) as exc:
                    # a frame the gateway cannot have meant: say so, count it as lost, never guess
                    tracker.bad_frames += 1
                    log.error("audit worker: malformed frame refused (%s)", type(exc).__name__)
            tracker.report(out, paced=True)
            if stop:
                break
    finally:
        metrics.cancel()
        # the span export stops beside the audit log's close (its exporter child may wait on a slow
        # collector for seconds), so that the whole close stays within the gateway's wait for it
        spans_closed = asyncio.create_task(spans.close()) if spans is not None else None
        await audit.close(close_timeout)
        if spans_closed is not None:
            await spans_closed
        tracker.report(out, force=True)
        out.send({"t": "metrics", "text": generate_latest(registry).decode()})
        out.send({"t": "closed"})
        for _ in range(200):  # let the last frames reach the pipe (bounded: 2 s)
            if out.transport.is_closing() or not out.transport.get_write_buffer_size():
                break
            await asyncio.sleep(0.01)
    return 0


def batch_scheduling() -> bool:
    """Put this process (and the threads and children it starts later) under Linux's ``SCHED_BATCH``
    policy (sched(7)): the same CPU share as before (same nice value, same fair-share weight), but
    its wake-ups do not preempt the task running on that core (session 14, issue 14). The worker wakes
    every ``READ_INTERVAL_S`` and on every sink reply; each such preemption of the gateway (or of a
    replica on a small machine) costs it a context switch and its caches. The worker then starts at
    the next scheduler tick or when the running task sleeps (a few milliseconds at most), well inside
    the 20 ms it already lets frames wait in the pipe. Returns False where the policy is not available
    (not Linux) or refused; nothing else changes then."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:
        return False
    return True


#: ``mallopt`` parameters (glibc's malloc.h): M_TRIM_THRESHOLD, M_MMAP_THRESHOLD
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: bytes: allocations below this come from the heap, not from a mapping of their own (glibc's own dynamic
#: threshold ends at 32 MiB on 64-bit; the worker's largest buffers, an OTLP request body, are ~0.3-1 MiB)
MALLOC_MMAP_THRESHOLD = 8 << 20
#: bytes of free memory at the top of the heap kept instead of returned to the kernel
MALLOC_TRIM_THRESHOLD = 32 << 20


def keep_heap() -> bool:
    """Tell glibc's allocator to keep freed memory for reuse (``mallopt``: mapping threshold
    :data:`MALLOC_MMAP_THRESHOLD`, trim threshold :data:`MALLOC_TRIM_THRESHOLD`; session 28, issue 14).

    With glibc's defaults the worker gave memory back to the kernel and faulted it in again after every
    batch (the OTLP bodies, the batch joins; the trim threshold follows the mapping threshold, a few
    hundred KiB): ~2.1 minor page faults per event at 1,500 events/s, each a kernel entry, a cleared page
    and a memory-cgroup charge; with these values ~0.35 (``bench.audit_overhead_worker``'s
    ``minflt_per_event``). The cost: up to :data:`MALLOC_TRIM_THRESHOLD` of freed heap stays mapped in
    this process. Returns False (nothing changed) where the C library is not glibc or refuses a value."""
    import ctypes
    import platform

    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover - glibc always has mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MALLOC_MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD))


def main() -> int:
    """Entry point of ``python -m audit.worker``: :func:`run` on a uvloop event loop (asyncio's own
    where uvloop is not installed), like the gateway: ~175 -> ~135 us of worker CPU per event when it
    woke once per answer (notes/s5-cost.md); it now reads stdin once per ``READ_INTERVAL_S``; scheduled
    as a batch process (:func:`batch_scheduling`); freed memory kept for reuse (:func:`keep_heap`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    batch_scheduling()
    keep_heap()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(stream=sys.stderr, level=os.environ.get("PREFIXGATE_AUDIT_WORKER_LOG", "WARNING"),
                        format="%(asctime)s audit-worker %(levelname)s %(message)s")
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.run(run())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(run())


if __name__ == "__main__":
    raise SystemExit(main())
