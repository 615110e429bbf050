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

import binascii
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.proto.resource.v1.resource_pb2 import Resource as PbResource
from opentelemetry.proto.trace.v1.trace_pb2 import ScopeSpans, SpanFlags
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PbSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanKind, StatusCode

from audit.otlp_pb import NotPlain, len_field, span_message
from audit.span_request import BYTES_MARK, REQUEST_MARK, expand_request_record, span_count

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
_KIND1 = {k.value: k.value + 1 for k in SpanKind}  # wire kind -> proto SpanKind
_CODE_VALUES = frozenset(c.value for c in StatusCode)
_M64 = (1 << 64) - 1
_pack_times = struct.Struct("<BQBQ").pack  # start (field 7) and end (field 8), both fixed64
_CHILD_TAIL = b"\x7a\x00\x85\x01" + struct.pack("<I", _FLAGS_LOCAL)  # empty status, flags (local parent)


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
            if isinstance(r, list) and len(r) == 6 and r[0] == BYTES_MARK and type(r[0]) is int:
                continue  # a bytes record: spans already encoded (OtlpRequestEncoder takes them as they are)
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
    wire records (``audit.span_frames.SPAN_FIELDS`` order), no ``ReadableSpan`` in between.

    The message equals what ``opentelemetry.exporter.otlp.proto.common.
    trace_encoder.encode_spans`` builds for the rebuilt spans
    (:class:`SpanDecoder`): one ``ResourceSpans`` (the gateway's resource),
    one ``ScopeSpans`` per instrumentation scope in order of first
    appearance, spans in batch order; trace/span ids big-endian bytes (16/8),
    kind = ``SpanKind.value + 1``, status message only for ERROR
    (``opentelemetry.trace.Status`` drops it otherwise), ``flags`` with the
    is_remote bits of the parent (span) or linked context (link), dropped
    counts, trace_state as sent.

    Since session 9 a record of the plain shape (no events, links without attributes, scalar
    attribute values) is written straight as its ``Span`` bytes (:func:`audit.otlp_pb.span_message`,
    ~4x cheaper than filling the generated message); any other record is built with the generated
    ``Span`` message (:func:`_fill_span`) and serialised on its own. The body is byte for byte the
    one the generated request message serialises to (tests/audit/test_s9_otlp_pb.py).
    """

    def __init__(self, resource: Resource) -> None:
        self._resource = PbResource(attributes=pb_attributes(resource.attributes))
        self._resource_schema_url = resource.schema_url
        # ResourceSpans.resource, always present (the SDK's Resource message), and its schema_url
        self._resource_field = len_field(b"\x0a", self._resource.SerializeToString())
        url = (resource.schema_url or "").encode()
        self._schema_field = len_field(b"\x1a", url) if url else b""
        self._scopes: dict[tuple, bytes] = {}  # scope key -> ScopeSpans.scope field (+ nothing else)
        self._last_tid: tuple[Any, Any, bytes] = (None, None, b"")
        self._child_heads: dict[tuple[str, Any], bytes] = {}  # (name, wire kind) -> name and kind fields

    def _scope_head(self, key: tuple | None) -> tuple[bytes, bytes]:
        """``(scope field, schema_url field)`` of a ScopeSpans for ``key`` ((name, version, url) or None).

        Raises:
            TypeError, ValueError: a name or version the generated message refuses."""
        hit = self._scopes.get(key)  # type: ignore[arg-type]
        if hit is None:
            ss = ScopeSpans()
            ss.scope.SetInParent()  # SDK: always a scope message, empty for no scope
            if key is not None:
                ss.scope.name = key[0]
                if key[1] is not None:
                    ss.scope.version = key[1]
                ss.schema_url = key[2]
            url = ss.schema_url.encode()
            hit = (len_field(b"\x0a", ss.scope.SerializeToString()), len_field(b"\x1a", url) if url else b"")
            if len(self._scopes) < 256:
                self._scopes[key] = hit  # type: ignore[index]
        return hit

    def _tid(self, hi: Any, lo: Any) -> bytes:
        last = self._last_tid
        if last[0] == hi and last[1] == lo and type(hi) is int and type(lo) is int:
            return last[2]
        if type(hi) is not int or type(lo) is not int or not 0 <= hi < _M64 + 1 or not 0 <= lo <= _M64:
            raise NotPlain("trace id")
        tid = ((hi << 64) | lo).to_bytes(16, "big")
        self._last_tid = (hi, lo, tid)
        return tid

    def _plain(self, f: Sequence[Any]) -> tuple[tuple | None, bytes]:
        """``(scope key, Span bytes)`` of a record of the plain shape; raises NotPlain (or an unpacking
        error) for any other."""
        (name, t_hi, t_lo, span_id, _flags, tstate, parent_id, parent_remote, kind, start, end, attrs,
         code, desc, links, events, s_name, s_version, s_schema, d_attrs, d_events, d_links) = f
        key = (s_name, s_version, s_schema or "") if s_name is not None else None
        self._scope_head(key)  # cached; a scope the generated message refuses fails here too
        if (attrs is None and links is None and events is None and code == 0 and type(code) is int
                and d_attrs == 0 == d_events == d_links and type(d_attrs) is int and type(d_links) is int
                and type(d_events) is int and parent_id is not None and parent_remote is False
                and type(start) is int and type(end) is int and start and end and type(name) is str and name
                and tstate is None):
            # a request's child span (audit.span_request.expand_request_record): ids, name, kind and times
            # around constant bytes
            nk = self._child_heads.get((name, kind))
            if nk is None:
                if kind not in _KIND1 or len(self._child_heads) >= 256:
                    raise NotPlain("kind")
                nk = self._child_heads[(name, kind)] = len_field(b"\x2a", name.encode()) + b"\x30" + bytes((_KIND1[kind],))
            return key, b"".join((b"\x0a\x10", self._tid(t_hi, t_lo), b"\x12\x08", span_id.to_bytes(8, "big"),
                                  b"\x22\x08", parent_id.to_bytes(8, "big"), nk, _pack_times(0x39, start, 0x41, end),
                                  _CHILD_TAIL))
        if events or d_events or kind not in _KIND1 or code not in _CODE_VALUES:
            raise NotPlain("events, kind or status")
        body = span_message(self._tid(t_hi, t_lo), span_id, tstate, parent_id, name, _KIND1[kind], start, end,
                            attrs, code, desc if code == _STATUS_ERROR and isinstance(desc, str) else None, links,
                            d_attrs, d_links, _FLAGS_REMOTE if parent_remote and parent_id is not None else _FLAGS_LOCAL)
        return key, body

    def encode(self, records: Sequence[Sequence[Any]]) -> tuple[bytes, int]:
        """Serialised request for ``records``. Returns ``(body, n_bad)``: a
        record that cannot be encoded is left out and counted (a bytes record,
        :data:`audit.span_request.BYTES_MARK`, as its spans: its bytes, base64 text from the pipe or
        ``bytes`` in the audit worker, are added as they are); the body is empty when no record could be encoded."""
        scopes: dict[tuple | None, list[bytes]] = {}
        bad = 0
        good = False
        for f in records:
            if type(f) is list and len(f) == 6 and f[0] == BYTES_MARK and type(f[0]) is int:
                try:  # spans already encoded as ScopeSpans.spans fields (audit.row_spans.row_span_bytes)
                    _, _n, s_name, s_version, s_schema, data = f
                    key = (s_name, s_version, s_schema or "") if s_name is not None else None
                    self._scope_head(key)
                    # bytes as they are from the audit worker's own sender (audit.span_post), base64 over the pipe
                    raw = data if type(data) is bytes else binascii.a2b_base64(data, strict_mode=True)
                except (binascii.Error, TypeError, ValueError, AttributeError):
                    bad += span_count(f)
                    continue
                spans = scopes.get(key)
                if spans is None:
                    spans = scopes[key] = []
                spans.append(raw)
                good = True
                continue
            try:
                key, body = self._plain(f)
            except (NotPlain, TypeError, ValueError, KeyError, AttributeError, OverflowError, struct.error):
                try:
                    key, body = self._generated(f, scopes)
                except (FrameError, KeyError, TypeError, ValueError, AttributeError, OverflowError):
                    bad += 1
                    continue
            spans = scopes.get(key)
            if spans is None:
                spans = scopes[key] = []
            spans.append(len_field(b"\x12", body))
            good = True
        if not good:
            return b"", bad
        parts = [self._resource_field]
        for key, spans in scopes.items():
            if not spans:  # an emptied scope (all its records bad) would differ from the SDK's output
                continue
            scope, url = self._scope_head(key)
            parts.append(len_field(b"\x12", b"".join([scope, *spans, url])))
        parts.append(self._schema_field)
        return len_field(b"\x0a", b"".join(parts)), bad

    def _generated(self, f: Sequence[Any], scopes: dict[tuple | None, list[bytes]]) -> tuple[tuple | None, bytes]:
        """``(scope key, Span bytes)`` of any record, with the generated ``Span`` message (the path of every
        record before session 9). The record's scope takes its place in the order even when the record
        turns out bad, as it did when the scope was added to the request first.

        Raises:
            FrameError, KeyError, TypeError, ValueError, AttributeError, OverflowError: a malformed record."""
        (name, t_hi, t_lo, span_id, _flags, tstate, parent_id, parent_remote, kind, start, end, attrs,
         code, desc, links, events, s_name, s_version, s_schema, d_attrs, d_events, d_links) = f
        key = (s_name, s_version, s_schema or "") if s_name is not None else None
        if key not in scopes:
            self._scope_head(key)  # a scope the generated message refuses fails the record here
            scopes[key] = []
        span = PbSpan()
        _fill_span(span, name, t_hi, t_lo, span_id, tstate, parent_id, parent_remote, kind, start,
                   end, attrs, code, desc, links, events, d_attrs, d_events, d_links)
        return key, span.SerializeToString()
