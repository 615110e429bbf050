"""Child process of :class:`audit.span_export.OffloadSpanProcessor`:
``python -m audit.span_exporter_proc``.

Reads newline-delimited orjson frames from stdin (first line: the config
object; then one JSON array of encoded spans per line, field order
``audit.span_export.SPAN_FIELDS``), rebuilds
``opentelemetry.sdk.trace.ReadableSpan`` objects with the gateway's resource,
and exports them with the SDK's own exporter (``OTLPSpanExporter`` over
OTLP/HTTP protobuf, or ``ConsoleSpanExporter``) in batches of up to
``max_batch`` spans, at least every ``flush_interval_s`` seconds -- the
batching of the SDK's ``BatchSpanProcessor``, so the bytes on the wire are
the SDK exporter's.

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
from typing import Any

import orjson
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

log = logging.getLogger("prefixgate.span_exporter_proc")

_KINDS = {k.value: k for k in SpanKind}
_CODES = {c.value: c for c in StatusCode}


class FrameError(ValueError):
    """A frame that is not valid JSON or not a list of encoded spans."""


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
        """One span from its wire list (``audit.span_export.SPAN_FIELDS`` order).

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
        try:
            records = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise FrameError("frame is not JSON") from exc
        if not isinstance(records, list):
            raise FrameError("frame is not a list")
        return [self.decode(r) for r in records]


def build_exporter(cfg: Mapping[str, Any]) -> SpanExporter:
    """The SDK exporter named by the config's ``exporter`` (``otlp`` or ``console``).

    Raises:
        ValueError: unknown exporter kind.
        ImportError: opentelemetry-exporter-otlp-proto-http missing for ``otlp``.
    """
    kind = cfg.get("exporter")
    if kind == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        return OTLPSpanExporter(endpoint=cfg.get("endpoint") or None, headers=cfg.get("headers") or None,
                                timeout=cfg.get("timeout_s"))
    if kind == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter
        return ConsoleSpanExporter()
    raise ValueError(f"unknown exporter {kind!r}")


def build_resource(cfg: Mapping[str, Any]) -> Resource:
    """The parent's resource exactly (no detectors re-run here)."""
    return Resource(decode_attributes(cfg.get("resource")) or {}, cfg.get("resource_schema_url"))


class ExportLoop:
    """Batching: export when ``max_batch`` spans are pending or every
    ``flush_interval_s`` seconds (``BatchSpanProcessor`` semantics).
    ``export`` is the SDK exporter's ``export``."""

    def __init__(self, export: Callable[[Sequence[ReadableSpan]], SpanExportResult], max_batch: int,
                 flush_interval_s: float) -> None:
        self._export = export
        self.max_batch = max_batch
        self.flush_interval_s = flush_interval_s
        self.pending: list[ReadableSpan] = []
        self.exported = 0
        self.failed = 0

    def add(self, spans: list[ReadableSpan]) -> None:
        """Queue spans; export full batches now."""
        self.pending.extend(spans)
        while len(self.pending) >= self.max_batch:
            batch, self.pending = self.pending[:self.max_batch], self.pending[self.max_batch:]
            self._send(batch)

    def flush(self) -> None:
        """Export everything pending, in batches of ``max_batch``."""
        while self.pending:
            batch, self.pending = self.pending[:self.max_batch], self.pending[self.max_batch:]
            self._send(batch)

    def _send(self, batch: Sequence[ReadableSpan]) -> None:
        try:
            result = self._export(batch)
        except Exception as exc:  # noqa: BLE001 -- an exporter bug must not end the child
            log.warning("span export raised %s (%d spans lost)", type(exc).__name__, len(batch))
            result = SpanExportResult.FAILURE
        if result == SpanExportResult.SUCCESS:
            self.exported += len(batch)
        else:
            self.failed += len(batch)
            log.warning("span export failed (%d spans lost, %d total)", len(batch), self.failed)


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
        exporter = build_exporter(cfg)
    except (ValueError, ImportError) as exc:
        log.error("cannot build span exporter: %s", exc)
        return 2
    decoder = SpanDecoder(build_resource(cfg))
    loop = ExportLoop(exporter.export, int(cfg.get("max_batch") or 512), float(cfg.get("flush_interval_s") or 0.5))
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
                    loop.add(decoder.decode_frame(line))
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
        exporter.shutdown()
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
