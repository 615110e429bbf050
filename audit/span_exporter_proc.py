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

OTLP fast path (default): the child does not rebuild ``ReadableSpan``
objects for ``otlp``; :class:`OtlpRequestEncoder` builds the
``ExportTraceServiceRequest`` in place from the wire records with the
opentelemetry-proto generated messages (~3.5 us per span instead of ~17 us
for rebuild + ``encode_spans``; bench/results/span_offload.json), and
:class:`DirectOtlpExporter` POSTs the bytes with the SDK exporter's own HTTP
client (same endpoint, headers, timeout, compression, retries and
``max_request_size`` as ``OTLPSpanExporter.export``). The bytes equal
``encode_spans(spans).SerializeToString()`` of the rebuilt spans
(tests/audit/test_span_offload.py). ``PREFIXGATE_SPAN_EXPORT_PATH=sdk`` in the
environment selects the rebuild + ``OTLPSpanExporter.export`` path instead.
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
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

log = logging.getLogger("prefixgate.span_exporter_proc")

#: environment variable: ``sdk`` selects the ReadableSpan rebuild + OTLPSpanExporter.export path.
SPAN_EXPORT_PATH_ENV = "PREFIXGATE_SPAN_EXPORT_PATH"

_KINDS = {k.value: k for k in SpanKind}
_CODES = {c.value: c for c in StatusCode}


class FrameError(ValueError):
    """A frame that is not valid JSON or not a list of encoded spans."""


class UnsupportedExporterError(RuntimeError):
    """The SDK exporter lacks the internals the OTLP fast path uses."""


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
        return [self.decode(r) for r in parse_records(line)]


# -- OTLP fast path: wire records straight to protobuf ------------------------------------------

#: Span.flags / Span.Link.flags bits (opentelemetry-proto trace.proto ``SpanFlags``), as the SDK
#: encoder sets them: "has is_remote" always, "is_remote" when the parent / linked context is remote.
_FLAGS_LOCAL = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_FLAGS_REMOTE = _FLAGS_LOCAL | SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_STATUS_ERROR = StatusCode.ERROR.value
_ANY_FIELD = {str: "string_value", bool: "bool_value", int: "int_value", float: "double_value"}
_N_FIELDS = 22  # len(audit.span_export.SPAN_FIELDS)


def _any_value(v: Any) -> dict[str, Any]:
    """One attribute value as an ``AnyValue`` init dict, with the SDK
    encoder's mapping (``_encode_value``): list/tuple -> array_value,
    ``{"b": hex}`` / bytes -> bytes_value, None (a NaN inside a list) -> empty.

    Raises:
        FrameError: a value type the wire format does not produce.
    """
    t = type(v)
    field = _ANY_FIELD.get(t)
    if field is not None:
        return {field: v}
    if t is list or t is tuple:
        return {"array_value": {"values": [_any_value(x) for x in v]}}
    if t is dict:
        return {"bytes_value": bytes.fromhex(v["b"])}
    if t is bytes:
        return {"bytes_value": v}
    if v is None:
        return {}
    raise FrameError(f"unsupported attribute value type {t.__name__}")


def pb_attributes(attrs: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """``KeyValue`` init dicts for an attribute mapping (wire or Python
    values), nulls left out as :func:`decode_attributes` does; None if empty."""
    if not attrs:
        return None
    return [{"key": k, "value": _any_value(v)} for k, v in attrs.items() if v is not None]


def check_records(records: Any) -> list[list[Any]]:
    """The span records of one decoded frame, shape-checked (each a list of
    ``len(SPAN_FIELDS)`` values).

    Raises:
        FrameError: not a list of span records.
    """
    if not isinstance(records, list):
        raise FrameError("frame is not a list")
    for r in records:
        if not isinstance(r, list) or len(r) != _N_FIELDS:
            raise FrameError("span record has the wrong shape")
    return records


class OtlpRequestEncoder:
    """Builds the OTLP/HTTP ``ExportTraceServiceRequest`` body for a batch of
    wire records (``audit.span_export.SPAN_FIELDS`` order) directly with the
    generated protobuf messages, no ``ReadableSpan`` in between.

    The message equals what ``opentelemetry.exporter.otlp.proto.common.
    trace_encoder.encode_spans`` builds for the rebuilt spans
    (:class:`SpanDecoder`): one ``ResourceSpans`` (the gateway's resource),
    one ``ScopeSpans`` per instrumentation scope in order of first
    appearance, spans in batch order; trace/span ids big-endian bytes (16/8),
    kind = ``SpanKind.value + 1``, status message only for ERROR
    (``opentelemetry.trace.Status`` drops it otherwise), ``flags`` with the
    is_remote bits of the parent (span) or linked context (link), dropped
    counts, trace_state as sent. Spans are built in place in the request
    (``RepeatedCompositeField.add``) so nothing is copied.
    """

    def __init__(self, resource: Resource) -> None:
        self._resource = PbResource(attributes=pb_attributes(resource.attributes))
        self._resource_schema_url = resource.schema_url

    def encode(self, records: Sequence[Sequence[Any]]) -> tuple[bytes, int]:
        """Serialised request for ``records``. Returns ``(body, n_bad)``: a
        record that cannot be encoded is left out and counted; the body is
        empty when no record could be encoded."""
        req = ExportTraceServiceRequest()
        rs = req.resource_spans.add()
        rs.resource.CopyFrom(self._resource)
        rs.resource.SetInParent()  # present even when empty, as the SDK's Resource message
        rs.schema_url = self._resource_schema_url
        scopes: dict[tuple, Any] = {}
        bad = 0
        good = 0
        for f in records:
            try:
                (name, t_hi, t_lo, span_id, _flags, tstate, parent_id, parent_remote, kind, start, end, attrs,
                 code, desc, links, events, s_name, s_version, s_schema, d_attrs, d_events, d_links) = f
                key = (s_name, s_version, s_schema or "") if s_name is not None else None
                spans = scopes.get(key)
                if spans is None:
                    ss = rs.scope_spans.add()
                    ss.scope.SetInParent()  # SDK: always a scope message, empty for no scope
                    if key is not None:
                        ss.scope.name = s_name
                        if s_version is not None:
                            ss.scope.version = s_version
                        ss.schema_url = key[2]
                    spans = scopes[key] = ss.spans
                kw = dict(
                    trace_id=((t_hi << 64) | t_lo).to_bytes(16, "big"), span_id=span_id.to_bytes(8, "big"),
                    trace_state=tstate,
                    parent_span_id=parent_id.to_bytes(8, "big") if parent_id is not None else None,
                    name=name, kind=_KINDS[kind].value + 1, start_time_unix_nano=start, end_time_unix_nano=end,
                    attributes=pb_attributes(attrs),
                    events=[{"name": en, "time_unix_nano": ets, "attributes": pb_attributes(ea)}
                            for en, ets, ea in events] if events else None,
                    links=[{"trace_id": ((lh << 64) | ll).to_bytes(16, "big"), "span_id": lsid.to_bytes(8, "big"),
                            "attributes": pb_attributes(la), "flags": _FLAGS_REMOTE if lrem else _FLAGS_LOCAL}
                           for lh, ll, lsid, _lf, lrem, la in links] if links else None,
                    status={"code": _CODES[code].value,
                            "message": desc if code == _STATUS_ERROR and isinstance(desc, str) else None},
                    dropped_attributes_count=d_attrs, dropped_events_count=d_events, dropped_links_count=d_links,
                    flags=_FLAGS_REMOTE if parent_remote and parent_id is not None else _FLAGS_LOCAL,
                )
            except (FrameError, KeyError, TypeError, ValueError, AttributeError, OverflowError):
                bad += 1
                continue
            n = len(spans)
            try:
                spans.add(**kw)
                good += 1
            except (TypeError, ValueError):
                if len(spans) > n:
                    del spans[n:]
                bad += 1
        if not good:
            return b"", bad
        # an emptied scope (all its records bad) would differ from the SDK's output
        for i in range(len(rs.scope_spans) - 1, -1, -1):
            if not rs.scope_spans[i].spans:
                del rs.scope_spans[i]
        return req.SerializeToString(), bad


class DirectOtlpExporter:
    """OTLP/HTTP export of wire records: :class:`OtlpRequestEncoder` for the
    body, the SDK ``OTLPSpanExporter``'s own HTTP client (its private
    ``_client``: endpoint, headers, timeout, gzip/deflate, retries with
    backoff on 429/502/503/504 and connection errors, per
    ``opentelemetry.exporter.otlp.common.http._OTLPHTTPClient``) for the POST,
    and its ``max_request_size`` check. Not replicated: the SDK exporter's
    self-observability metrics (off unless
    ``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED``).

    Raises:
        UnsupportedExporterError: the SDK exporter has no such client
            (another SDK version); callers fall back to the rebuild path.
    """

    def __init__(self, sdk_exporter: SpanExporter, encoder: OtlpRequestEncoder) -> None:
        client = getattr(sdk_exporter, "_client", None)
        if not callable(getattr(client, "export", None)):
            raise UnsupportedExporterError("SDK exporter has no _client.export")
        self._client = client
        self._max_request_size = int(getattr(sdk_exporter, "_max_request_size", 0) or 0)
        self._sdk_exporter = sdk_exporter
        self.encoder = encoder
        self.bad_records = 0

    def export(self, records: Sequence[Sequence[Any]]) -> SpanExportResult:
        """Encode and POST one batch. SUCCESS only on an HTTP 2xx/3xx
        (after the client's retries); records that cannot be encoded are
        counted in ``bad_records`` and do not fail the rest."""
        if getattr(self._sdk_exporter, "_shutdown", False):
            return SpanExportResult.FAILURE
        body, bad = self.encoder.encode(records)
        if bad:
            self.bad_records += bad
            log.warning("dropped %d unencodable span records (%d so far)", bad, self.bad_records)
        if not body:
            return SpanExportResult.FAILURE if bad else SpanExportResult.SUCCESS
        if 0 < self._max_request_size < len(body):
            log.warning("dropping span batch: %d bytes exceeds max_request_size %d", len(body),
                        self._max_request_size)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS if self._client.export(body).success else SpanExportResult.FAILURE


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


@dataclass(frozen=True)
class Pipeline:
    """How the child turns frames into exports.

    ``parse``: one frame line -> items (wire records on the OTLP fast path,
    ``ReadableSpan`` otherwise), raising :class:`FrameError`; ``export``: a
    batch of those items -> ``SpanExportResult``; ``exporter``: the SDK
    exporter (shut down at exit); ``fast``: True on the OTLP fast path.
    """

    parse: Callable[[bytes], list[Any]]
    export: Callable[[Sequence[Any]], SpanExportResult]
    exporter: SpanExporter
    fast: bool


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
    """The child's pipeline for its config: for ``otlp`` the fast path
    (:class:`DirectOtlpExporter`) unless ``PREFIXGATE_SPAN_EXPORT_PATH=sdk``
    in ``env`` (default ``os.environ``) or the SDK exporter lacks the client
    it needs; otherwise ``ReadableSpan`` rebuild + the SDK exporter's ``export``.

    Raises:
        ValueError: unknown exporter kind.
        ImportError: opentelemetry-exporter-otlp-proto-http missing for ``otlp``.
    """
    env = os.environ if env is None else env
    exporter = build_exporter(cfg)
    resource = build_resource(cfg)
    if cfg.get("exporter") == "otlp" and env.get(SPAN_EXPORT_PATH_ENV, "fast") != "sdk":
        try:
            direct = DirectOtlpExporter(exporter, OtlpRequestEncoder(resource))
        except UnsupportedExporterError as exc:
            log.warning("OTLP fast path unavailable (%s); rebuilding ReadableSpans", exc)
        else:
            return Pipeline(parse_records, direct.export, exporter, True)
    decoder = SpanDecoder(resource)
    return Pipeline(decoder.decode_frame, exporter.export, exporter, False)


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
        self.exported = 0
        self.failed = 0

    def add(self, spans: list[Any]) -> None:
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

    def _send(self, batch: Sequence[Any]) -> None:
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
        pipe = build_pipeline(cfg)
    except (ValueError, ImportError) as exc:
        log.error("cannot build span exporter: %s", exc)
        return 2
    exporter = pipe.exporter
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
