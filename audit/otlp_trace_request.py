"""Building the OTLP ``ExportTraceServiceRequest`` body from span wire records, on public APIs only.

Used by the span exporter child (:mod:`audit.span_exporter_proc`) for
``exporter: otlp``: :class:`OtlpRequestEncoder` builds the request from
the wire records (``audit.span_frames.SPAN_FIELDS`` order) with the
generated messages of ``opentelemetry-proto``, no ``ReadableSpan`` in
between (~3.5 us per span instead of ~17 us for rebuild + the SDK's
``encode_spans``; bench/results/span_offload.json). The bytes equal the
SDK encoder's for the same spans (tests/audit/test_span_offload.py).
Sending the body is :mod:`audit.otlp_traces`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)
from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.proto.trace.v1.trace_pb2 import SpanFlags
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanKind, StatusCode

from audit.span_request import REQUEST_MARK, expand_request_record

__all__ = ["FrameError", "OtlpRequestEncoder", "check_records", "pb_attributes"]


_KINDS = {k.value: k for k in SpanKind}
_CODES = {c.value: c for c in StatusCode}


class FrameError(ValueError):
    """A frame that is not valid JSON or not a list of encoded spans."""


#: Span.flags / Span.Link.flags bits (opentelemetry-proto trace.proto ``SpanFlags``), as the SDK
#: encoder sets them: "has is_remote" always, "is_remote" when the parent / linked context is remote.
_FLAGS_LOCAL = SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_FLAGS_REMOTE = _FLAGS_LOCAL | SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK
_STATUS_ERROR = StatusCode.ERROR.value
_ANY_FIELD = {str: "string_value", bool: "bool_value", int: "int_value", float: "double_value"}
_N_FIELDS = 22  # len(audit.span_frames.SPAN_FIELDS)


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
    ``len(SPAN_FIELDS)`` values); a request record (:mod:`audit.span_request`) is
    replaced by its spans (:func:`audit.span_request.expand_request_record`, child ids made here).

    Raises:
        FrameError: not a list of span records.
    """
    if not isinstance(records, list):
        raise FrameError("frame is not a list")
    expand = False
    for r in records:
        if not isinstance(r, list) or len(r) != _N_FIELDS:
            if isinstance(r, list) and r and r[0] == REQUEST_MARK:
                expand = True  # a request record (audit.span_request): its spans, made here
                continue
            raise FrameError("span record has the wrong shape")
    if not expand:
        return records
    out: list[list[Any]] = []
    for r in records:
        if r[0] == REQUEST_MARK:
            try:
                out.extend(expand_request_record(r))
            except (TypeError, ValueError) as exc:
                raise FrameError(str(exc)) from exc
        else:
            out.append(r)
    return out

def _set_attributes(field: Any, attrs: Mapping[str, Any] | None) -> None:
    """Append ``attrs`` (wire values) to a repeated ``KeyValue`` field in place: the same
    messages as ``field.extend(pb_attributes(attrs))`` builds (str/bool/int/float set
    directly, anything else through :func:`_any_value`); nulls left out."""
    if not attrs:
        return
    add = field.add
    for k, v in attrs.items():
        if v is None:
            continue
        f = _ANY_FIELD.get(type(v))
        if f is not None:
            kv = add()
            kv.key = k
            setattr(kv.value, f, v)
        else:
            add(key=k, value=_any_value(v))


def _fill_span(span: Any, name: Any, t_hi: Any, t_lo: Any, span_id: Any, tstate: Any, parent_id: Any,
               parent_remote: Any, kind: Any, start: Any, end: Any, attrs: Any, code: Any, desc: Any, links: Any,
               events: Any, d_attrs: Any, d_events: Any, d_links: Any) -> None:
    """Fill a freshly added ``Span`` message in place from one wire record's fields: the message
    ``Span(**kw)`` built from the same record before session 7 (a ``None`` leaves the field
    unset, as a ``None`` keyword did), without the keyword dicts (tests/audit/test_s7_span_encode.py).

    Raises:
        FrameError, KeyError, TypeError, ValueError, AttributeError, OverflowError: a malformed
            record (the caller removes the partly filled span and counts it).
    """
    span.trace_id = ((t_hi << 64) | t_lo).to_bytes(16, "big")
    span.span_id = span_id.to_bytes(8, "big")
    if tstate is not None:
        span.trace_state = tstate
    if parent_id is not None:
        span.parent_span_id = parent_id.to_bytes(8, "big")
    if name is not None:
        span.name = name
    span.kind = _KINDS[kind].value + 1
    if start is not None:
        span.start_time_unix_nano = start
    if end is not None:
        span.end_time_unix_nano = end
    _set_attributes(span.attributes, attrs)
    if events:
        add_event = span.events.add
        for en, ets, ea in events:
            add_event(name=en, time_unix_nano=ets, attributes=pb_attributes(ea))
    if links:
        add_link = span.links.add
        for lh, ll, lsid, _lf, lrem, la in links:
            add_link(trace_id=((lh << 64) | ll).to_bytes(16, "big"), span_id=lsid.to_bytes(8, "big"),
                     attributes=pb_attributes(la), flags=_FLAGS_REMOTE if lrem else _FLAGS_LOCAL)
    status = span.status
    status.SetInParent()  # always present, as the SDK's encoder writes it
    status.code = _CODES[code].value
    if code == _STATUS_ERROR and isinstance(desc, str):
        status.message = desc
    if d_attrs is not None:
        span.dropped_attributes_count = d_attrs
    if d_events is not None:
        span.dropped_events_count = d_events
    if d_links is not None:
        span.dropped_links_count = d_links
    span.flags = _FLAGS_REMOTE if parent_remote and parent_id is not None else _FLAGS_LOCAL


class OtlpRequestEncoder:
    """Builds the OTLP/HTTP ``ExportTraceServiceRequest`` body for a batch of
    wire records (``audit.span_frames.SPAN_FIELDS`` order) directly with the
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
            spans = None
            n = 0
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
                n = len(spans)
                _fill_span(spans.add(), name, t_hi, t_lo, span_id, tstate, parent_id, parent_remote, kind, start,
                           end, attrs, code, desc, links, events, d_attrs, d_events, d_links)
            except (FrameError, KeyError, TypeError, ValueError, AttributeError, OverflowError):
                if spans is not None and len(spans) > n:
                    del spans[n:]  # the partly built span
                bad += 1
                continue
            good += 1
        if not good:
            return b"", bad
        # an emptied scope (all its records bad) would differ from the SDK's output
        for i in range(len(rs.scope_spans) - 1, -1, -1):
            if not rs.scope_spans[i].spans:
                del rs.scope_spans[i]
        return req.SerializeToString(), bad
