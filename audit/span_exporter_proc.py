"""Child process of :class:`audit.span_export.OffloadSpanProcessor`:
``python -m audit.span_exporter_proc``.

Reads newline-delimited orjson frames from stdin (first line: the config
object; then one JSON array of encoded spans per line, field order
``audit.span_frames.SPAN_FIELDS``) and exports them in batches of up to
``max_batch`` spans, at least every ``flush_interval_s`` seconds -- the
batching of the SDK's ``BatchSpanProcessor``.

``otlp``: :class:`audit.otlp_trace_request.OtlpRequestEncoder` builds the
``ExportTraceServiceRequest`` straight from the wire records with the
opentelemetry-proto messages (the bytes equal the SDK encoder's for the same
spans) and :class:`audit.otlp_traces.OtlpHttpSender` POSTs it per the
OTLP/HTTP specification (retries on 429/502/503/504 with backoff, partial
success). Only public APIs of the OpenTelemetry packages are used.
``console``: the spans are rebuilt as ``ReadableSpan`` objects
(:class:`SpanDecoder`) for the SDK's ``ConsoleSpanExporter``.

Lifecycle: SIGINT/SIGTERM are ignored (the parent ends us by closing stdin;
if the parent is SIGKILLed the pipe closes too). On stdin EOF the pending
spans are exported, the exporter is shut down, and the process exits 0.
stderr carries diagnostics only (counts, errors), never span contents.
"""
from __future__ import annotations

import logging
import os
import selectors
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from audit.otlp_trace_request import FrameError, OtlpRequestEncoder, check_records, pb_attributes
from audit.otlp_traces import OtlpHttpSender, OtlpHttpSettings
from audit.span_request import span_count

__all__ = [
    "ExportLoop",
    "FrameError",
    "OtlpRequestEncoder",
    "OtlpTraceExporter",
    "Pipeline",
    "SpanDecoder",
    "build_pipeline",
    "build_resource",
    "check_records",
    "decode_attributes",
    "parse_records",
    "pb_attributes",
    "run",
]

log = logging.getLogger("prefixgate.span_exporter_proc")

_KINDS = {k.value: k for k in SpanKind}
_CODES = {c.value: c for c in StatusCode}


def _value(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_value(x) for x in v)
    if isinstance(v, dict):  # bytes travel as {"b": hex}
        return bytes.fromhex(v["b"])
    return v


def decode_attributes(attrs: Mapping[str, Any] | None, dropped: int = 0) -> Mapping[str, Any] | None:
    """Attribute dict from the wire: lists back to tuples, ``{"b": hex}`` back
    to bytes, nulls (NaN floats become JSON null) removed. With ``dropped`` > 0
    a ``BoundedAttributes`` carrying that count, so the OTLP
    ``dropped_attributes_count`` survives the trip."""
    if not attrs:
        out: dict[str, Any] = {}
    else:
        out = {k: _value(v) for k, v in attrs.items() if v is not None}
    if dropped:
        bounded = BoundedAttributes(maxlen=None, attributes=out, immutable=True)
        bounded.dropped = dropped
        return bounded
    return out or None


class SpanDecoder:
    """Rebuilds ``ReadableSpan`` objects for one resource; instrumentation
    scopes are interned so the OTLP encoder groups spans per scope."""

    def __init__(self, resource: Resource) -> None:
        self.resource = resource
        self._scopes: dict[tuple, InstrumentationScope | None] = {}

    def _scope(self, name: str | None, version: str | None, schema_url: str | None) -> InstrumentationScope | None:
        key = (name, version, schema_url)
        scope = self._scopes.get(key)
        if scope is None and key not in self._scopes:
            scope = InstrumentationScope(name, version, schema_url) if name is not None else None
            self._scopes[key] = scope
        return scope

    def decode(self, f: Sequence[Any]) -> ReadableSpan:
        """One span from its wire list (``audit.span_frames.SPAN_FIELDS`` order).

        Raises:
            FrameError: wrong shape.
        """
        try:
            (name, t_hi, t_lo, span_id, flags, tstate, parent_id, parent_remote, kind, start, end, attrs,
             code, desc, links, events, s_name, s_version, s_schema, d_attrs, d_events, d_links) = f
        except (TypeError, ValueError) as exc:
            raise FrameError("span record has the wrong shape") from exc
        trace_id = (t_hi << 64) | t_lo
        ts = TraceState.from_header([tstate]) if tstate else None
        ctx = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags), trace_state=ts)
        parent = SpanContext(trace_id, parent_id, is_remote=parent_remote) if parent_id is not None else None
        link_objs: Sequence[Link] = [
            Link(SpanContext((lh << 64) | ll, lsid, is_remote=lrem, trace_flags=TraceFlags(lflags)),
                 attributes=decode_attributes(lattrs))
            for lh, ll, lsid, lflags, lrem, lattrs in links
        ] if links else ()
        event_objs: Sequence[Event] = [
            Event(ename, attributes=decode_attributes(eattrs), timestamp=ets) for ename, ets, eattrs in events
        ] if events else ()
        if d_links:
            link_objs = BoundedList.from_seq(None, link_objs)
            link_objs.dropped = d_links
        if d_events:
            event_objs = BoundedList.from_seq(None, event_objs)
            event_objs.dropped = d_events
        return ReadableSpan(
            name=name, context=ctx, parent=parent, resource=self.resource,
            attributes=decode_attributes(attrs, d_attrs), events=event_objs, links=link_objs,
            kind=_KINDS[kind], status=Status(_CODES[code], desc), start_time=start, end_time=end,
            instrumentation_scope=self._scope(s_name, s_version, s_schema),
        )

    def decode_frame(self, line: bytes) -> list[ReadableSpan]:
        """All spans of one frame (one JSON array).

        Raises:
            FrameError: invalid JSON or shape.
        """
        return [self.decode(r) for r in parse_records(line)]


class OtlpTraceExporter:
    """Export of wire records over OTLP/HTTP: encode a batch
    (:class:`OtlpRequestEncoder`) and POST it (:class:`OtlpHttpSender`).

    Records that cannot be encoded are left out, counted in ``bad_records``
    and do not fail the rest.
    """

    def __init__(self, encoder: OtlpRequestEncoder, sender: OtlpHttpSender) -> None:
        self.encoder = encoder
        self.sender = sender
        self.bad_records = 0

    def export(self, records: Sequence[Sequence[Any]]) -> SpanExportResult:
        """Encode and POST one batch; SUCCESS once the collector answered 2xx."""
        body, bad = self.encoder.encode(records)
        if bad:
            self.bad_records += bad
            log.warning("dropped %d unencodable span records (%d so far)", bad, self.bad_records)
        if not body:
            return SpanExportResult.FAILURE if bad else SpanExportResult.SUCCESS
        return SpanExportResult.SUCCESS if self.sender.export(body) else SpanExportResult.FAILURE

    def shutdown(self) -> None:
        """Stop the sender (idempotent)."""
        self.sender.shutdown()


def build_resource(cfg: Mapping[str, Any]) -> Resource:
    """The parent's resource exactly (no detectors re-run here)."""
    return Resource(decode_attributes(cfg.get("resource")) or {}, cfg.get("resource_schema_url"))


@dataclass(frozen=True)
class Pipeline:
    """How the child turns frames into exports.

    ``parse``: one frame line -> items (wire records for ``otlp``,
    ``ReadableSpan`` for ``console``), raising :class:`FrameError`;
    ``export``: a batch of those items -> ``SpanExportResult``; ``shutdown``:
    called once at exit.
    """

    parse: Callable[[bytes], list[Any]]
    export: Callable[[Sequence[Any]], SpanExportResult]
    shutdown: Callable[[], None]


def parse_records(line: bytes) -> list[list[Any]]:
    """Wire records of one frame, shape-checked.

    Raises:
        FrameError: invalid JSON or shape.
    """
    try:
        records = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise FrameError("frame is not JSON") from exc
    return check_records(records)


def build_pipeline(cfg: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Pipeline:
    """The child's pipeline for its config (``exporter``: ``otlp`` or ``console``).

    ``otlp``: wire records -> :class:`OtlpTraceExporter`, endpoint, headers
    and timeout from ``cfg`` or else the ``OTEL_EXPORTER_OTLP_*`` variables of
    ``env`` (default ``os.environ``; :meth:`OtlpHttpSettings.resolve`).
    ``console``: ``ReadableSpan`` rebuild + the SDK's ``ConsoleSpanExporter``.

    Raises:
        ValueError: unknown exporter kind, or a bad endpoint / timeout / compression.
    """
    kind = cfg.get("exporter")
    resource = build_resource(cfg)
    if kind == "otlp":
        settings = OtlpHttpSettings.resolve(cfg.get("endpoint") or None, cfg.get("headers") or None,
                                            cfg.get("timeout_s"), env)
        exporter = OtlpTraceExporter(OtlpRequestEncoder(resource), OtlpHttpSender(settings))
        return Pipeline(parse_records, exporter.export, exporter.shutdown)
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        console = ConsoleSpanExporter()
        return Pipeline(SpanDecoder(resource).decode_frame, console.export, console.shutdown)
    raise ValueError(f"unknown exporter {kind!r}")


def _weight(item: Any) -> int:
    """Spans an item of the export loop stands for: a bytes record its count, anything else 1."""
    return span_count(item) if type(item) is list and len(item) == 6 else 1


class ExportLoop:
    """Batching: export when ``max_batch`` spans are pending or every
    ``flush_interval_s`` seconds (``BatchSpanProcessor`` semantics).
    ``export`` is the pipeline's export (items: wire records or ``ReadableSpan``)."""

    def __init__(self, export: Callable[[Sequence[Any]], SpanExportResult], max_batch: int,
                 flush_interval_s: float) -> None:
        self._export = export
        self.max_batch = max_batch
        self.flush_interval_s = flush_interval_s
        self.pending: list[Any] = []
        self.pending_spans = 0  # spans in ``pending`` (a bytes record stands for several)
        self.exported = 0
        self.failed = 0

    def add(self, spans: list[Any]) -> None:
        """Queue spans; export full batches now."""
        self.pending.extend(spans)
        self.pending_spans += sum(map(_weight, spans))
        while self.pending_spans >= self.max_batch:
            self._send(self._take())

    def flush(self) -> None:
        """Export everything pending, in batches of ``max_batch`` spans (a bytes record is not split)."""
        while self.pending:
            self._send(self._take())

    def _take(self) -> list[Any]:
        """The oldest items holding up to ``max_batch`` spans (at least one item)."""
        n = w = 0
        pending = self.pending
        while n < len(pending) and (n == 0 or w + _weight(pending[n]) <= self.max_batch):
            w += _weight(pending[n])
            n += 1
        batch, self.pending = pending[:n], pending[n:]
        self.pending_spans -= w
        return batch

    def _send(self, batch: Sequence[Any]) -> None:
        n = sum(map(_weight, batch))
        try:
            result = self._export(batch)
        except Exception as exc:  # noqa: BLE001 -- an exporter bug must not end the child
            log.warning("span export raised %s (%d spans lost)", type(exc).__name__, n)
            result = SpanExportResult.FAILURE
        if result == SpanExportResult.SUCCESS:
            self.exported += n
        else:
            self.failed += n
            log.warning("span export failed (%d spans lost, %d total)", n, self.failed)


def run(fd: int = 0) -> int:
    """Main loop over the pipe at ``fd``. Returns the exit status."""
    buf = bytearray()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    cfg: dict[str, Any] | None = None
    while cfg is None:  # config line
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return 0
        buf += chunk
        nl = buf.find(b"\n")
        if nl >= 0:
            cfg = orjson.loads(bytes(buf[:nl]))
            del buf[:nl + 1]
    try:
        pipe = build_pipeline(cfg)
    except ValueError as exc:
        log.error("cannot build span exporter: %s", exc)
        return 2
    loop = ExportLoop(pipe.export, int(cfg.get("max_batch") or 512), float(cfg.get("flush_interval_s") or 0.5))
    bad_frames = 0
    eof = False
    next_flush = time.monotonic() + loop.flush_interval_s
    while True:
        if buf or eof:
            lines = bytes(buf).split(b"\n")
            rest = lines.pop()
            buf = bytearray(b"" if eof else rest)
            if eof and rest:
                bad_frames += 1  # parent died mid-write: a truncated last frame
            for line in lines:
                if not line:
                    continue
                try:
                    loop.add(pipe.parse(line))
                except (FrameError, KeyError, TypeError, ValueError):
                    bad_frames += 1
                    log.warning("dropped a malformed span frame (%d bytes, %d so far)", len(line), bad_frames)
        if eof:
            break
        now = time.monotonic()
        if now >= next_flush:
            loop.flush()
            next_flush = now + loop.flush_interval_s
        if sel.select(max(0.0, next_flush - time.monotonic())):
            chunk = os.read(fd, 1 << 20)
            if chunk:
                buf += chunk
            else:
                eof = True
    loop.flush()
    try:
        pipe.shutdown()
    except Exception as exc:  # noqa: BLE001
        log.warning("span exporter shutdown raised %s", type(exc).__name__)
    if loop.failed or bad_frames:
        log.warning("span exporter child exiting: %d exported, %d failed, %d bad frames",
                    loop.exported, loop.failed, bad_frames)
    return 0


def main() -> int:
    """Entry point: ignore SIGINT/SIGTERM, log diagnostics to stderr, run.

    The parent spawns us with SIGINT/SIGTERM blocked (the mask survives
    exec), so one that arrives during interpreter start-up stays pending and
    is discarded here when the disposition becomes SIG_IGN before unblocking.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING,
                        format="%(asctime)s span_exporter_proc[%(process)d] %(levelname)s %(message)s")
    return run(sys.stdin.fileno())


if __name__ == "__main__":
    sys.exit(main())
