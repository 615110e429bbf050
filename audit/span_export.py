"""Gateway side of off-process span export: :class:`OffloadSpanProcessor`.

Why: with ``BatchSpanProcessor`` + ``OTLPSpanExporter`` the protobuf encoding
and the HTTP export run in a thread of the gateway process, holding the GIL
(~80 us of gateway CPU per request, 5 spans; docs/audit.md "overhead"). This
processor only turns each finished span into a plain tuple (``on_end``,
a few microseconds on the event-loop thread, never blocking), and a small
writer thread ships batches as newline-delimited orjson frames over a pipe to
a child process (:mod:`audit.span_exporter_proc`) that builds the OTLP
request with opentelemetry-proto (the same bytes as the SDK's encoder) and
POSTs it per the OTLP/HTTP spec (:mod:`audit.otlp_traces`).

Why a thread: the SDK calls the processor from whatever thread ends a span (no event loop);
a blocking ``os.write`` there releases the GIL while the kernel copies, and a stuck child only
stalls that thread (the queue is bounded: spans are dropped, never blocking the gateway).

Wire format (one line = one frame, at most ``max_batch`` spans)::

    line 1 (config, JSON object): {"exporter": "otlp"|"console", "endpoint": ..., "headers": {...},
                                   "timeout_s": ..., "resource": {...}, "resource_schema_url": ...,
                                   "flush_interval_s": ..., "max_batch": ...}
    then:  [record, ...]\n    with record = a span (SPAN_FIELDS, :func:`audit.span_frames.encode_span`), a
           request (REQUEST_FIELDS, :mod:`audit.span_request`: its spans made by the child) or a bytes
           record (``BYTES_MARK``: spans already encoded as OTLP bytes, ``otlp`` only; session 9)

The config goes on stdin, not argv: collector headers may carry credentials
and argv is readable by every local user in ``/proc/<pid>/cmdline``.

Delivery is best effort (telemetry, unlike audit events): spans are dropped and counted when the
queue is full, when no child is running (restart gap, with backoff), or when a span cannot be
encoded. Spans already inside the pipe or the child when the child dies are lost uncounted.

Here: the processor and the child's lifecycle; encoding and frames: :mod:`audit.span_frames`.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
from binascii import b2a_base64
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

from audit.backoff import Backoff
from audit.span_frames import encode_frames, encode_span
from audit.span_request import BYTES_MARK, span_count

log = logging.getLogger(__name__)


_F_SETPIPE_SZ = 1031  # Linux fcntl, fcntl.F_SETPIPE_SZ on Python >= 3.10 (Linux only)
_CHILD_IGNORED = {signal.SIGINT, signal.SIGTERM}
_PIPE_SIZE = 1 << 20  # bytes; best effort (capped by /proc/sys/fs/pipe-max-size)


DROP_QUEUE_FULL = "queue_full"
DROP_NO_EXPORTER = "exporter_down"
DROP_ENCODE = "encode_error"


class SpanExportConfigError(ValueError):
    """Invalid offload configuration (unknown exporter kind, bad sizes)."""


def _child_env() -> dict[str, str]:
    """The child's environment: ours, plus the project root on PYTHONPATH so
    ``-m audit.span_exporter_proc`` resolves from any working directory, and
    ``PYTHONSAFEPATH=1`` (with ``-P``) so that it never imports the working
    directory's ``audit`` (R12-4)."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONSAFEPATH"] = "1"
    return env


class OffloadSpanProcessor(SpanProcessor):
    """SpanProcessor that hands finished spans to an exporter child process.

    Args:
        exporter: ``"otlp"`` (OTLP/HTTP protobuf, :mod:`audit.otlp_traces`) or ``"console"``.
        resource: the TracerProvider's resource (sent to the child once, at start).
        endpoint: OTLP traces URL, e.g. ``http://collector:4318/v1/traces``
            (None: the child's OTEL_EXPORTER_OTLP_* environment decides).
        headers: extra HTTP headers for the collector (may be credentials:
            sent over stdin only).
        timeout_s: per-export HTTP timeout, seconds (None: SDK default 10 s).
        flush_interval_s: how often the writer pushes the queue into the pipe, seconds.
        max_batch: spans per frame, and queue length that wakes the writer early.
        max_queue_spans: bound on queued + in-flight spans; beyond it new spans
            are dropped and counted (``dropped``).
        child_flush_interval_s: how often the child exports a partial batch, seconds.
        registry: prometheus ``CollectorRegistry`` for
            ``prefixgate_trace_spans_dropped_total{reason}`` (optional).
        restart_backoff_s: ``(initial, max)`` delay before restarting a dead child, seconds.

    Raises:
        SpanExportConfigError: unknown exporter kind or non-positive sizes.

    Threads: ``on_end`` runs on the caller's thread (the event loop) and only
    appends to a ``collections.deque`` (atomic under the GIL); one daemon
    writer thread serialises, writes, and restarts the child.
    """

    def __init__(self, exporter: str, resource: Resource, *, endpoint: str | None = None,
                 headers: Mapping[str, str] | None = None, timeout_s: float | None = None,
                 flush_interval_s: float = 0.2, max_batch: int = 512, max_queue_spans: int = 20_000,
                 child_flush_interval_s: float = 0.5, registry: Any | None = None,
                 restart_backoff_s: tuple[float, float] = (0.1, 5.0)) -> None:
        if exporter not in ("otlp", "console"):
            raise SpanExportConfigError(f"unknown span exporter {exporter!r} (offload supports otlp, console)")
        if max_batch <= 0 or max_queue_spans <= 0 or flush_interval_s <= 0:
            raise SpanExportConfigError("max_batch, max_queue_spans and flush_interval_s must be > 0")
        self._config = {
            "exporter": exporter, "endpoint": endpoint, "headers": dict(headers or {}), "timeout_s": timeout_s,
            "resource": dict(resource.attributes), "resource_schema_url": resource.schema_url or None,
            "flush_interval_s": child_flush_interval_s, "max_batch": max_batch,
        }
        self._flush_interval = flush_interval_s
        self._max_batch = max_batch
        self._max_queue = max_queue_spans
        self._backoff = restart_backoff_s
        self._queue: collections.deque[tuple] = collections.deque()
        self._in_flight = self._extra_in = self._extra_out = 0  # spans popped, not yet written; request
        # records' spans beyond one per queued item (added by the producer only, taken by the writer only)
        self._wake = threading.Event()
        self._lock = threading.Lock()  # drop counters, flush waiters, child handle
        self._flush_waiters: list[threading.Event] = []
        self._closed = False
        self._stopping = False
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread: threading.Thread | None = None
        self._restarts = 0
        self._dropped_by: dict[str, int] = collections.Counter()
        self._counter = None
        if registry is not None:
            from prometheus_client import Counter
            self._counter = Counter("prefixgate_trace_spans_dropped_total",
                                    "Spans dropped before reaching the span exporter child (best-effort telemetry).",
                                    ["reason"], registry=registry)

    # -- observability
    @property
    def dropped(self) -> int:
        """Spans dropped so far (all reasons)."""
        with self._lock:
            return sum(self._dropped_by.values())

    @property
    def dropped_by_reason(self) -> dict[str, int]:
        """Dropped spans per reason: ``queue_full``, ``exporter_down``, ``encode_error``."""
        with self._lock:
            return dict(self._dropped_by)

    @property
    def restarts(self) -> int:
        """How many times the child was restarted after dying."""
        return self._restarts

    @property
    def child_pid(self) -> int | None:
        """pid of the current child process, or None."""
        return proc.pid if (proc := self._proc) is not None else None

    def _drop(self, n: int, reason: str) -> None:
        if n <= 0:
            return
        with self._lock:
            self._dropped_by[reason] += n
        if self._counter is not None:
            self._counter.labels(reason).inc(n)

    # -- lifecycle
    def start(self) -> None:
        """Spawn the child and the writer thread. Idempotent. A child that
        fails to spawn is retried by the writer thread (spans dropped, counted)."""
        if self._thread is not None:
            return
        try:
            self._spawn()
        except OSError as exc:
            log.warning("span exporter child failed to start: %s", exc)
        self._thread = threading.Thread(target=self._run, name="span-offload-writer", daemon=True)
        self._thread.start()

    def _spawn(self) -> None:
        # SIGINT/SIGTERM blocked across fork+exec (the mask is inherited): a
        # Ctrl-C that reaches the whole process group while the child is still
        # importing stays pending until the child has set SIG_IGN.
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _CHILD_IGNORED)
        try:
            proc = subprocess.Popen([sys.executable, "-P", "-m", "audit.span_exporter_proc"], stdin=subprocess.PIPE,
                                    env=_child_env(), close_fds=True)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        assert proc.stdin is not None
        fd = proc.stdin.fileno()
        with contextlib.suppress(OSError):
            fcntl.fcntl(fd, _F_SETPIPE_SZ, _PIPE_SIZE)
        try:
            self._write_all(fd, orjson.dumps(self._config, option=orjson.OPT_APPEND_NEWLINE))
        except OSError:
            proc.kill()
            proc.wait()
            raise
        with self._lock:
            self._proc = proc

    @staticmethod
    def _write_all(fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]

    def _close_child(self, proc: subprocess.Popen[bytes], kill: bool) -> None:
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        if kill:
            proc.kill()
        try:
            proc.wait(timeout=1.0 if kill else None)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL not reaped in 1 s
            pass

    def _run(self) -> None:
        """Writer thread: every ``flush_interval_s`` (or when woken) push the
        queue into the pipe; restart a dead child with exponential backoff."""
        next_restart = 0.0
        backoff = Backoff(*self._backoff)
        started_at = time.monotonic()
        while True:
            self._wake.wait(self._flush_interval)
            self._wake.clear()
            stopping = self._stopping
            with self._lock:
                waiters, self._flush_waiters = self._flush_waiters, []
            proc = self._proc
            if proc is not None and proc.poll() is not None:
                log.warning("span exporter child %d exited with %s; restarting", proc.pid, proc.returncode)
                self._close_child(proc, kill=False)
                with self._lock:
                    self._proc = proc = None
                if time.monotonic() - started_at > 60.0:  # it had been healthy: restart fast again
                    backoff.reset()
                next_restart = time.monotonic() + backoff.next()
            if proc is None and not stopping and time.monotonic() >= next_restart:
                try:
                    self._spawn()
                    self._restarts += 1
                    started_at = time.monotonic()
                    proc = self._proc
                except OSError as exc:
                    log.warning("span exporter child restart failed: %s", exc)
                    next_restart = time.monotonic() + backoff.next()
            self._push(proc)
            for w in waiters:
                w.set()
            if stopping:
                if proc is not None:
                    with contextlib.suppress(OSError):
                        proc.stdin.close()  # type: ignore[union-attr]
                return

    def _push(self, proc: subprocess.Popen[bytes] | None) -> None:
        q = self._queue
        n = len(q)
        if n == 0:
            return
        self._in_flight = n + self._extra_in - self._extra_out  # counted against the bound before leaving the queue
        popleft = q.popleft
        batch = [popleft() for _ in range(n)]
        extra = sum(span_count(r) - 1 for r in batch if type(r[0]) is int)  # request / bytes records' other spans
        self._extra_out += extra
        n += extra
        self._in_flight = n
        try:
            if proc is None:
                self._drop(n, DROP_NO_EXPORTER)
                return
            data, bad = encode_frames(batch, self._max_batch, span_count)
            self._drop(bad, DROP_ENCODE)
            try:
                self._write_all(proc.stdin.fileno(), data)  # type: ignore[union-attr]
            except (OSError, ValueError):  # EPIPE: child died; ValueError: stdin closed
                self._drop(n - bad, DROP_NO_EXPORTER)
        finally:
            self._in_flight = 0

    # -- SpanProcessor
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Nothing to do at span start."""

    #: :func:`audit.tracing.end_request_trace` hands this processor a request record (:meth:`on_end_request`)
    takes_encoded = True

    def on_end(self, span: ReadableSpan) -> None:
        """Queue one finished span (never blocks; drops and counts when the
        queue holds ``max_queue_spans``)."""
        if self._closed:
            return
        if len(self._queue) + self._in_flight >= self._max_queue:  # checked before the encoding's cost
            self._drop(1, DROP_QUEUE_FULL)
            return
        try:
            encoded = encode_span(span)
        except Exception:  # noqa: BLE001 -- a malformed span must never break the request path
            self._drop(1, DROP_ENCODE)
            return
        self.on_end_encoded(encoded)

    def on_end_encoded(self, encoded: tuple) -> None:
        """Queue one finished span already encoded (:data:`audit.span_frames.SPAN_FIELDS` order), as
        :meth:`on_end` does (never blocks; drops and counts when the queue holds ``max_queue_spans``)."""
        self._enqueue(encoded, 1)

    def on_end_request(self, record: tuple) -> None:
        """Queue a request's spans as one compact record (:func:`audit.span_request.encode_request_record`;
        the child expands it): bound, drops and wake counted in the spans it stands for (the whole
        request dropped when they do not all fit). Called from one thread (the gateway's event loop)."""
        self._enqueue(record, len(record[12]) + 1)

    def on_end_span_bytes(self, data: bytes, k: int, scope: tuple) -> None:
        """Queue ``k`` spans of ``scope`` (name, version, url) encoded as ``ScopeSpans.spans`` fields (``data``,
        :func:`audit.row_spans.row_span_bytes`; ``otlp`` child only) as a bytes record (``BYTES_MARK``)."""
        self._enqueue((BYTES_MARK, k, *scope, b2a_base64(data, newline=False).decode("ascii")), k)

    def _enqueue(self, item: tuple, k: int) -> None:
        if self._closed:
            return
        q = self._queue
        queued = len(q) + self._extra_in - self._extra_out  # spans queued
        if queued + k + self._in_flight > self._max_queue:
            self._drop(k, DROP_QUEUE_FULL)
            return
        q.append(item)
        if k > 1:
            self._extra_in += k - 1  # written by the producer only, _extra_out by the writer only
        if queued < self._max_batch <= queued + k:
            self._wake.set()

    def on_end_encoded_many(self, spans: Sequence[tuple]) -> None:
        """Queue a request's spans already encoded, in one call: what :meth:`on_end_encoded` does
        for each in turn (those past ``max_queue_spans`` dropped and counted)."""
        for one in spans:
            self._enqueue(one, 1)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Push everything queued so far into the pipe. Returns False if the
        writer did not finish within ``timeout_millis`` (or is not running).
        Does not wait for the child to export."""
        if self._thread is None or not self._thread.is_alive():
            return False
        done = threading.Event()
        with self._lock:
            self._flush_waiters.append(done)
        self._wake.set()
        return done.wait(timeout_millis / 1000.0)

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Flush, close the child's stdin (it exports what it holds and
        exits), wait up to ``timeout_s`` seconds for it, then kill it.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout_s
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        proc = self._proc
        if proc is None:
            return
        if self._thread is not None and self._thread.is_alive():
            proc.kill()  # writer stuck writing to a child that does not read
            self._thread.join(1.0)
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("span exporter child %d did not exit within %.1f s; killing", proc.pid, timeout_s)
            proc.kill()
            proc.wait()
        with self._lock:
            self._proc = None
